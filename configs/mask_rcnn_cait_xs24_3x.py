# CaiT-XS24 Mask R-CNN 3x on COCO (XCiT recipe). Neither the CaiT nor the XCiT paper reports
# this model: there is no reference AP.
_base_ = './_base_/mask_rcnn_cait_3x_coco.py'

arch = 'xs24'
embed_dim = 288
pretrained = 'https://dl.fbaipublicfiles.com/deit/XS24_384.pth'
img_size = 384  # XS24 was released at 384 only: its 24x24 position embedding loads as trained
model = dict(
    backbone=dict(arch=arch, img_size=img_size, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4))
