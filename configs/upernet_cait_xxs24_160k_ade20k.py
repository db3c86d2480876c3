# CaiT-XXS24 UperNet 160k on ADE20k (512x512, XCiT's segmentation recipe). Neither the CaiT nor the
# XCiT paper reports this model: there is no reference mIoU.
_base_ = './_base_/upernet_cait_160k_ade20k.py'

arch = 'xxs24'
embed_dim = 192
pretrained = 'https://dl.fbaipublicfiles.com/deit/XXS24_224.pth'
model = dict(
    backbone=dict(arch=arch, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))
