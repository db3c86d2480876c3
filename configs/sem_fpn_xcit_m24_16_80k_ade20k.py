# XCiT-M24/16 Semantic FPN 80k on ADE20k. Paper (Table 6, ImageNet-1k pretraining),
# single-scale val: mIoU 45.9.
_base_ = './_base_/sem_fpn_xcit_80k_ade20k.py'

arch = 'medium_24_p16'
embed_dim = 512
pretrained = 'https://dl.fbaipublicfiles.com/xcit/xcit_medium_24_p16_224.pth'
model = dict(
    # drop path 0.2 as the official config (sem_fpn_xcit_medium_24_p16_80k_ade20k.py), not Table
    # B.1's 0.15 for M24, which the UperNet and Mask R-CNN recipes use
    backbone=dict(arch=arch, drop_path_rate=0.2, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4, out_channels=embed_dim),
    decode_head=dict(in_channels=[embed_dim] * 4))
