# Demo: a timm ViT-Ti/16 (vit_tiny_patch16_224) Mask R-CNN with ViTDet's simple feature pyramid,
# trained from scratch on the embedded synthetic shapes dataset (tools/make_demo_data.py
# data/shapes). Everything but the backbone comes from the XCiT demo (256x256 images, AdamW, COCO
# bbox/segm mAP on the held-out split). A 256x256 image is a 16x16 grid of patches: the ViT's
# global attention is cheap there. Any name of timm's vision_transformer / deit, eva and beit
# modules works the same way with type='TimmViT', 'TimmEVA' or 'TimmBEiT' (docs/backbones.md).
_base_ = './mask_rcnn_xcit_nano_12_p8_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='TimmViT',
        arch='vit_tiny_patch16_224',
        # ViTDet: every level rescaled from the last block (stride 16: two transposed convs to
        # stride 4, one to 8, itself at 16, max-pooled to 32)
        pyramid='simple',
        norm_cfg=dict(type='BN', requires_grad=True),
        init_cfg=None),  # from scratch: no hub access here
    neck=dict(in_channels=[192] * 4))  # ViT-Ti: embed_dim 192
# the position embedding and the class token do not decay (timm's no_weight_decay())
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.),
                                                     'cls_token': dict(decay_mult=0.)}))
