# CaiT-XS24 UperNet 160k on ADE20k (512x512, XCiT's segmentation recipe). Neither the CaiT nor the
# XCiT paper reports this model: there is no reference mIoU.
_base_ = './_base_/upernet_cait_160k_ade20k.py'

arch = 'xs24'
embed_dim = 288
pretrained = 'https://dl.fbaipublicfiles.com/deit/XS24_384.pth'
img_size = 384  # XS24 was released at 384 only: its 24x24 position embedding loads as trained
model = dict(
    backbone=dict(arch=arch, img_size=img_size, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))
