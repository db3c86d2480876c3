# Demo: the linear demo (mask_rcnn_xcit_nano_12_p8_shapes.py) with XCiT's Q/K/V embedding replaced by
# F-SNE with code size 8 at the parameter-matched width ("F-SNE 8*" of the non-linear Q/K/V paper:
# d = 128 -> hidden 186, Table 1), so the backbone has as many parameters as the linear one
# (within 0.1k a block). Same data, schedule and seed; compare its bbox/segm mAP with the linear
# demo's.
_base_ = './mask_rcnn_xcit_nano_12_p8_shapes.py'

model = dict(backbone=dict(qkv_cfg=dict(type='FSNE', code_size=8, hidden='*')))
# The codes Cq, Ck, Cv are not weight-decayed (../_base_/default_runtime.py).
