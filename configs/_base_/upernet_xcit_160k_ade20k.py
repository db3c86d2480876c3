# UperNet 160k on ADE20k with an XCiT backbone: the recipe of the XCiT paper (Table 6, section 4.3)
# and its official code, features tapped from blocks 4/6/8/12 (12 layers) or 8/12/16/24 (24
# layers). mmseg's UperNet (models/upernet.py) and the segmentation schedule
# (schedules/ade20k_160k.py) with XCiT in place of the ResNet.
#
# Children set `arch`, `embed_dim` and `pretrained` *and* the model fields that use them (mmengine
# evaluates this file before the child, so changing a variable alone changes nothing).
_base_ = ['./models/upernet.py', './schedules/ade20k_160k.py']

arch = 'small_12_p16'  # see deepvit_mm.XCiT.arch_zoo
embed_dim = 384  # T: 192, S: 384, M: 512; every tap has embed_dim channels
# ImageNet-1k weights, as for detection (mask_rcnn_xcit_3x_coco.py)
pretrained = f'https://dl.fbaipublicfiles.com/xcit/xcit_{arch}_224.pth'

model = dict(
    pretrained=None,  # the base's ResNet weights; XCiT's come through backbone.init_cfg
    backbone=dict(
        _delete_=True,  # drop the ResNet arguments
        type='XCiT',
        arch=arch,
        # drop path, LayerScale init, taps and SyncBN as for detection (mask_rcnn_xcit_3x_coco.py)
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        # evaluation images (short side 512, long side as the aspect ratio gives) go through
        # unpadded, as in the official code, so an official checkpoint computes what it did there;
        # training crops are 512x512 either way
        pad_input=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))
