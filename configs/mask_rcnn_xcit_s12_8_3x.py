# XCiT-S12/8 Mask R-CNN 3x on COCO. Paper (Table 5, ImageNet-1k pretraining), minival:
# box AP 47.0, mask AP 42.3.
_base_ = './_base_/mask_rcnn_xcit_3x_coco.py'

arch = 'small_12_p8'
embed_dim = 384
pretrained = 'https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p8_224.pth'
model = dict(
    backbone=dict(arch=arch, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4))
