# XCiT-T12/16 Mask R-CNN 3x on COCO with the P-SNE Q/K/V embedding (partially shared non-linear:
# a ReLU layer per Q, K, V, a shared second layer; d = 192 -> hidden 144, the non-linear Q/K/V
# paper's Table 1). Paper: ImageNet-1k top-1 77.8 vs 77.1 for linear T12 (Table 2); it gives no COCO
# numbers. The linear recipe's box AP 42.7 / mask AP 38.5 (XCiT Table 5) is the reference.
_base_ = './mask_rcnn_xcit_t12_16_3x.py'

# The parent's ImageNet checkpoint is linear-Q/K/V XCiT: everything else loads, and the load
# report lists the P-SNE layers as left at init. Point `pretrained` (and init_cfg) at a P-SNE
# ImageNet checkpoint, if you have one, to load them too.
model = dict(backbone=dict(qkv_cfg=dict(type='PSNE')))
