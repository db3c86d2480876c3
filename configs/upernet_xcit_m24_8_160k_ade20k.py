# XCiT-M24/8 UperNet 160k on ADE20k. Paper (Table 6, ImageNet-1k pretraining),
# single-scale val: mIoU 48.4.
_base_ = './_base_/upernet_xcit_160k_ade20k.py'

arch = 'medium_24_p8'
embed_dim = 512
pretrained = 'https://dl.fbaipublicfiles.com/xcit/xcit_medium_24_p8_224.pth'
model = dict(
    backbone=dict(arch=arch, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))
