# XCiT-M24/16 Mask R-CNN 3x on COCO. Paper (Table 5, ImageNet-1k pretraining), minival:
# box AP 46.7, mask AP 42.0.
_base_ = './_base_/mask_rcnn_xcit_3x_coco.py'

arch = 'medium_24_p16'
embed_dim = 512
pretrained = 'https://dl.fbaipublicfiles.com/xcit/xcit_medium_24_p16_224.pth'
model = dict(
    backbone=dict(arch=arch, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4))
