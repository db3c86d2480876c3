# Mask R-CNN 3x on COCO with an XCiT backbone: the recipe of the XCiT paper (Table 5, section 4.2):
# Mask R-CNN + FPN, 36 epochs, AdamW lr 1e-4, weight decay 0.05, batch 16, DETR's multi-scale
# training augmentation, features tapped from blocks 4/6/8/12 (12 layers) or 8/12/16/24 (24).
#
# Inherits mmdet's Swin-T 3x recipe, which already has all of that except the backbone: COCO
# instances (118k train / 5k val, bbox + segm evaluation), the DETR-style augmentation (random
# resize, or resize-crop-resize; shorter side 480..800, longer side <= 1333), AdamW lr 1e-4
# wd 0.05, 36 epochs with lr x0.1 after epochs 27 and 33 (+ 1000-iteration linear warm-up).
# Overridden here: the backbone, the FPN's input channels, the weight-decay exemptions, and the
# number of checkpoints kept.
#
# Children set `arch`, `embed_dim` and `pretrained` *and* the model fields that use them (mmengine
# evaluates this file before the child, so changing a variable alone changes nothing).
_base_ = ['mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py']
custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)

arch = 'small_12_p16'  # see deepvit_mm.XCiT.arch_zoo
embed_dim = 384  # T: 192, S: 384, M: 512; every tap has embed_dim channels
# ImageNet-1k weights, downloaded here beforehand (nothing is fetched at train time): the
# official release (https://dl.fbaipublicfiles.com/xcit/xcit_<size>_p<patch>_224.pth) or timm's
# (Hugging Face timm/xcit_<size>_p<patch>_224.fb_in1k; point `pretrained` at its .safetensors).
pretrained = f'checkpoints/xcit_{arch}_224.pth'

model = dict(
    backbone=dict(
        _delete_=True,  # drop the Swin arguments
        type='XCiT',
        arch=arch,
        # drop path and LayerScale init default to the paper's Table B.1 for `arch`; taps to the
        # paper's blocks (out_indices)
        # SyncBN (the BatchNorms of the conv patch embedding, LPI and pyramid adapter) as in the
        # paper's multi-GPU training. In a non-distributed run (one GPU, CPU) mmengine's Runner
        # reverts SyncBN to BN by itself; `--cfg-options model.backbone.norm_cfg.type=BN` says
        # so explicitly.
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[embed_dim] * 4))

# Batch 16 (the paper's) = 8 GPUs x 2 images.
# 36 epochs x 118,287 images / 16 = 7,393 iterations an epoch x 36 = ~266k iterations.
# With another total batch, `--cfg-options auto_scale_lr.enable=True` makes mmengine's Runner scale
# the lr linearly by (GPUs x batch_size) / 16.
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

# AdamW as in the paper. No weight decay on norm layers (by type: LayerNorms of the blocks and
# BatchNorms of the conv parts, which Swin's substring key 'norm' would miss), LayerScale
# (gamma1..3), the XCA temperature and the Fourier position encoding.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        _delete_=True,  # drop Swin's keys (absolute_pos_embed, relative_position_bias_table)
        norm_decay_mult=0.,
        custom_keys={
            '.gamma1': dict(decay_mult=0.),
            '.gamma2': dict(decay_mult=0.),
            '.gamma3': dict(decay_mult=0.),
            '.temperature': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))

default_hooks = dict(checkpoint=dict(type='CrashSafeCheckpointHook', interval=1, max_keep_ckpts=3))
# stop on a NaN/inf loss; RNG state in checkpoints for bit-identical resumes (deepvit_mm.runtime)
custom_hooks = [dict(type='FiniteLossHook'), dict(type='RNGStateHook')]
