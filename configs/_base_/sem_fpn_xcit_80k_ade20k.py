# Semantic FPN 80k on ADE20k with an XCiT backbone: the recipe of the XCiT paper (Table 6, section
# 4.3) and its official code (facebookresearch/xcit, semantic_segmentation/, mmseg 0.11): FPN neck
# with embed_dim channels + Semantic FPN head (128 channels), features tapped from blocks 4/6/8/12
# (12 layers) or 8/12/16/24 (24 layers). mmseg's FPN + FPNHead model and the segmentation
# schedule at 80k iterations (schedules/ade20k_80k.py).
#
# Children set `arch`, `embed_dim` and `pretrained` *and* the model fields that use them (mmengine
# evaluates this file before the child, so changing a variable alone changes nothing).
_base_ = ['./upstream/mmseg/_base_/models/fpn_r50.py', './schedules/ade20k_80k.py']

arch = 'small_12_p16'  # see deepvit_mm.XCiT.arch_zoo
embed_dim = 384  # T: 192, S: 384, M: 512; every tap has embed_dim channels
# ImageNet-1k weights, as for detection (mask_rcnn_xcit_3x_coco.py)
pretrained = f'https://dl.fbaipublicfiles.com/xcit/xcit_{arch}_224.pth'

model = dict(
    pretrained=None,  # the base's ResNet weights; XCiT's come through backbone.init_cfg
    data_preprocessor=dict(size=_base_.crop_size),  # batches padded to the 512x512 crops
    backbone=dict(
        _delete_=True,  # drop the ResNet arguments
        type='XCiT',
        arch=arch,
        # drop path, LayerScale init, taps and SyncBN as for detection (mask_rcnn_xcit_3x_coco.py)
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        pad_input=False,  # evaluation images go through unpadded (upernet_xcit_160k_ade20k.py)
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    # the official code's FPN keeps embed_dim channels (mmseg's R-50 base has 256)
    neck=dict(in_channels=[embed_dim] * 4, out_channels=embed_dim),
    decode_head=dict(in_channels=[embed_dim] * 4, channels=128, feature_strides=[4, 8, 16, 32],
                     num_classes=150))
