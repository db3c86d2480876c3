# UperNet 160k on ADE20k with a CaiT backbone: the XCiT paper's segmentation recipe (section 4.3,
# following Swin) unchanged: mmseg's UperNet (models/upernet.py) and the segmentation schedule
# (schedules/ade20k_160k.py) with CaiT in place of the ResNet; taps at 1/3, 1/2, 2/3 and the end of
# the trunk -> strides 4/8/16/32. At 512x512 the /16 grid has 1,024 tokens, so every block keeps
# CaiT's global attention.
#
# Children set `arch`, `embed_dim` and `pretrained` *and* the model fields that use them (mmengine
# evaluates this file before the child, so changing a variable alone changes nothing).
_base_ = ['./models/upernet.py', './schedules/ade20k_160k.py']

arch = 's24'  # see deepvit_mm.CaiT.arch_zoo
embed_dim = 384  # XXS: 192, XS: 288, S: 384; every tap has embed_dim channels
# ImageNet-1k weights and `img_size` as for detection (mask_rcnn_cait_3x_coco.py)
pretrained = 'https://dl.fbaipublicfiles.com/deit/S24_224.pth'
img_size = 224

model = dict(
    pretrained=None,  # the base's ResNet weights; CaiT's come through backbone.init_cfg
    backbone=dict(
        _delete_=True,  # drop the ResNet arguments
        type='CaiT',
        arch=arch,
        img_size=img_size,
        # drop path and LayerScale init: the paper's Table 4 for `arch`; SyncBN in the pyramid
        # adapter, reverted to BN by mmengine's Runner in a non-distributed run
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))

# Weight decay: the official XCiT rule (../default_runtime.py) with the key the official configs
# copied from Swin for its learned absolute position embedding ('absolute_pos_embed') read as
# CaiT's, 'pos_embed', which CaiT's own ImageNet training also left undecayed (timm's
# Cait.no_weight_decay). Everything else as for XCiT: only the LayerNorms skip decay.
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.)}))
