# XCiT-T12/16 Semantic FPN 80k on ADE20k. Paper (Table 6, ImageNet-1k pretraining),
# single-scale val: mIoU 38.1.
_base_ = './_base_/sem_fpn_xcit_80k_ade20k.py'

arch = 'tiny_12_p16'
embed_dim = 192
pretrained = 'https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p16_224.pth'
model = dict(
    backbone=dict(arch=arch, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4, out_channels=embed_dim),
    decode_head=dict(in_channels=[embed_dim] * 4))
