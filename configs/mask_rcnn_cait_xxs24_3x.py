# CaiT-XXS24 Mask R-CNN 3x on COCO (XCiT recipe). Neither the CaiT nor the XCiT paper reports
# this model: there is no reference AP.
_base_ = './_base_/mask_rcnn_cait_3x_coco.py'

arch = 'xxs24'
embed_dim = 192
pretrained = 'https://dl.fbaipublicfiles.com/deit/XXS24_224.pth'
model = dict(
    backbone=dict(arch=arch, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4))
