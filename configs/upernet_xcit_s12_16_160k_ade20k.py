# XCiT-S12/16 UperNet 160k on ADE20k. Paper (Table 6, ImageNet-1k pretraining),
# single-scale val: mIoU 45.9.
_base_ = './_base_/upernet_xcit_160k_ade20k.py'

arch = 'small_12_p16'
embed_dim = 384
pretrained = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_224.pth'
model = dict(
    backbone=dict(arch=arch, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))
