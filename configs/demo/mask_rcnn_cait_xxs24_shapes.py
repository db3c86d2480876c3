# Demo: CaiT-XXS24 Mask R-CNN trained from scratch on the embedded synthetic shapes dataset
# (tools/make_demo_data.py data/shapes). Everything but the backbone comes from the XCiT demo:
# 256x256 images, 250 iterations of batch 4, AdamW, COCO bbox/segm mAP on the held-out split.
# A 256x256 image is a 16x16 grid of patches: CaiT's global attention (the default) is cheap there.
_base_ = './mask_rcnn_xcit_nano_12_p8_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='CaiT',
        arch='xxs24',
        norm_cfg=dict(type='BN', requires_grad=True),
        init_cfg=None),  # from scratch: no hub access here
    neck=dict(in_channels=[192] * 4))  # CaiT-XXS: embed_dim 192
# CaiT's learned position embedding does not decay, as in the CaiT recipes
# (../_base_/mask_rcnn_cait_3x_coco.py)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.)}))
