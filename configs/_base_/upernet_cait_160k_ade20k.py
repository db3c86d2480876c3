# UperNet 160k on ADE20k with a CaiT backbone: the XCiT paper's segmentation recipe (section 4.3,
# following Swin): UperNet, 160k iterations, batch 16, AdamW lr 6e-5, weight decay 0.01, 512x512
# crops, single-scale evaluation.
#
# Inherits mmseg's UperNet R50 160k recipe (ADE20k data and pipeline, UPerHead + FCN auxiliary
# head, SyncBN, 160k iterations, checkpoints and validation every 16k). Overridden here: the
# backbone, the heads' input channels, the optimizer and schedule (Swin's UperNet recipe, which the
# XCiT paper follows: AdamW, 1,500-iteration linear warm-up, then linear (power 1) decay to 0) and
# the batch (8 GPUs x 2 images instead of 4 x 4; still 16).
#
# At 512x512 the /16 grid has 1,024 tokens, so every block keeps CaiT's global attention.
# Children set `arch`, `embed_dim` and `pretrained` *and* the model fields that use them.
_base_ = ['mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py']
custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)

arch = 's24'  # see deepvit_mm.CaiT.arch_zoo
embed_dim = 384  # XXS: 192, XS: 288, S: 384; every tap has embed_dim channels
# ImageNet-1k weights downloaded beforehand: official (https://dl.fbaipublicfiles.com/deit/
# S24_224.pth) or timm's (.safetensors). `img_size`: the checkpoint's resolution, so that its
# position embedding loads as trained (it is resampled to each input's grid at run time).
pretrained = 'checkpoints/S24_224.pth'
img_size = 224

model = dict(
    pretrained=None,  # the base's ResNet weights (open-mmlab://resnet50_v1c)
    backbone=dict(
        _delete_=True,  # drop the ResNet arguments
        type='CaiT',
        arch=arch,
        img_size=img_size,
        # drop path and LayerScale init: the paper's Table 4 for `arch`; taps at 1/3, 1/2, 2/3 and
        # the end of the trunk -> strides 4/8/16/32
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))  # in_index=2: the stride-16 map

# Batch 16 (the paper's) = 8 GPUs x 2 images; 160k iterations x 16 / 20,210 images = ~127 epochs.
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

# AdamW, no weight decay on norm layers (by type), LayerScale and the position embedding.
optim_wrapper = dict(
    _delete_=True,  # drop the base's SGD
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={
            '.gamma_1': dict(decay_mult=0.),
            '.gamma_2': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
