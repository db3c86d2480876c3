# Demo: a timm ViT-Ti/16 (vit_tiny_patch16_224) Mask R-CNN with ViTDet's simple feature pyramid,
# trained from scratch on the embedded synthetic shapes dataset (tools/make_demo_data.py
# data/shapes). Everything but the backbone comes from the XCiT demo (256x256 images, AdamW, COCO
# bbox/segm mAP on the held-out split). A 256x256 image is a 16x16 grid of patches: the ViT's
# global attention is cheap there. Any name of timm's vision_transformer / deit, eva and beit
# modules works the same way with type='TimmViT', 'TimmEVA' or 'TimmBEiT' (docs/backbones.md).
# A plain ViT from scratch takes a lower lr than the XCiT demo's and no drop path; measured
# (torch 2.13, float32, 1,100 steps of batch 2, held-out bbox / segm mAP; the run's machine and
# time: docs/backbones.md#timms-other-columnar-transformers-vit-deit-dinov2-eva-02-beit): the
# XCiT demo's lr 1.5e-3 with drop path 0.1: 0.024 / 0.028
# (the loss stayed near 2.4); lr 3e-4 without drop path (this file): 0.316 / 0.319. The XCiT-N12/8
# demo reaches ~0.62 / 0.56 in the same steps: a stride-16 ViT without convolutions learns these
# small shapes more slowly.
_base_ = './mask_rcnn_xcit_nano_12_p8_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='TimmViT',
        arch='vit_tiny_patch16_224',
        # ViTDet: every level rescaled from the last block (stride 16: two transposed convs to
        # stride 4, one to 8, itself at 16, max-pooled to 32)
        pyramid='simple',
        drop_path_rate=0.0,
        norm_cfg=dict(type='BN', requires_grad=True),
        init_cfg=None),  # from scratch: no hub access here
    neck=dict(in_channels=[192] * 4))  # ViT-Ti: embed_dim 192
# the position embedding and the class token do not decay (timm's no_weight_decay())
optim_wrapper = dict(optimizer=dict(lr=3e-4),
                     paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.),
                                                     'cls_token': dict(decay_mult=0.)}))
