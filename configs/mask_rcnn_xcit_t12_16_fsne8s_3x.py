# XCiT-T12/16 Mask R-CNN 3x on COCO with the F-SNE 8* Q/K/V embedding (fully shared non-linear with
# codes of size 8, shared by all layers, at the parameter-matched width: d = 192 -> hidden 282, the
# non-linear Q/K/V paper's Table 1). Paper: ImageNet-1k top-1 77.7 vs 77.1 for linear T12 (Table 2);
# no COCO numbers. The linear recipe's box AP 42.7 / mask AP 38.5 (XCiT Table 5) is the reference.
_base_ = './mask_rcnn_xcit_t12_16_3x.py'

# The parent's ImageNet checkpoint is linear-Q/K/V XCiT: everything else loads, and the load
# report lists the F-SNE layers and the codes as left at init.
model = dict(backbone=dict(qkv_cfg=dict(type='FSNE', code_size=8, hidden='*')))
# The codes Cq, Ck, Cv are not weight-decayed (./_base_/default_runtime.py).
