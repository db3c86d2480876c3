# XCiT-T12/16 UperNet 160k on ADE20k with the P-SNE Q/K/V embedding (partially shared non-linear:
# separate first layers, one shared second layer; hidden 3d/4 = 144, the non-linear Q/K/V paper's
# Table 1). Paper: ImageNet-1k top-1 77.8 vs 77.1 for linear T12 (its Table 2); it gives no ADE20k
# numbers (XCiT's Table 6: linear T12/16 UperNet 41.5 mIoU). Everything else is the linear recipe.
_base_ = './upernet_xcit_t12_16_160k_ade20k.py'

# The parent's ImageNet checkpoint is linear-Q/K/V XCiT: everything else loads, and the load
# report lists the P-SNE layers as left at init.
model = dict(backbone=dict(qkv_cfg=dict(type='PSNE')))
