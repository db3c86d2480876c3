# UperNet 160k on ADE20k with an XCiT backbone: the recipe of the XCiT paper (Table 6, section 4.3)
# and its official code (facebookresearch/xcit, semantic_segmentation/, mmseg 0.11): UperNet
# (UPerHead 512 channels + FCN auxiliary head on the stride-16 level), 160k iterations, AdamW
# lr 6e-5, weight decay 0.01, batch 16, 512x512 crops, single-scale evaluation (no flip, no
# multi-scale), features tapped from blocks 4/6/8/12 (12 layers) or 8/12/16/24 (24 layers).
#
# Inherits mmseg's UperNet R-50 160k ADE20k recipe, which already has the heads, the ADE20k data
# pipeline (random resize of (2048, 512) x 0.5..2.0, 512x512 crop, flip, photometric distortion;
# test: resize to (2048, 512) keeping the ratio, whole-image inference) and the 160k schedule.
# Overridden here: the backbone, the heads' input channels, the optimizer and the lr schedule (as
# in the paper's code, adopted from Swin), the batch split.
#
# Children set `arch`, `embed_dim` and `pretrained` *and* the model fields that use them (mmengine
# evaluates this file before the child, so changing a variable alone changes nothing).
_base_ = ['mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py']
custom_imports = dict(imports=['deepvit_mm'], allow_failed_imports=False)

arch = 'small_12_p16'  # see deepvit_mm.XCiT.arch_zoo
embed_dim = 384  # T: 192, S: 384, M: 512; every tap has embed_dim channels
# ImageNet-1k weights, downloaded here beforehand (nothing is fetched at train time): the
# official release (https://dl.fbaipublicfiles.com/xcit/xcit_<size>_p<patch>_224.pth) or timm's
# (Hugging Face timm/xcit_<size>_p<patch>_224.fb_in1k; point `pretrained` at its .safetensors).
pretrained = f'checkpoints/xcit_{arch}_224.pth'
max_iters = 160000
warmup_iters = 1500

model = dict(
    pretrained=None,  # the base's ResNet weights; XCiT's come through backbone.init_cfg
    backbone=dict(
        _delete_=True,  # drop the ResNet arguments
        type='XCiT',
        arch=arch,
        # drop path and LayerScale init default to the paper's Table B.1 for `arch`; taps to the
        # paper's blocks (out_indices)
        # SyncBN (the BatchNorms of the conv patch embedding, LPI and pyramid adapter) as in the
        # paper's multi-GPU training; mmengine's Runner reverts it to BN in a non-distributed run.
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        # evaluation images (short side 512, long side as the aspect ratio gives) go through
        # unpadded, as in the official code, so an official checkpoint computes what it did there;
        # training crops are 512x512 either way
        pad_input=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[embed_dim] * 4, channels=512, num_classes=150),
    auxiliary_head=dict(in_channels=embed_dim, in_index=2, num_classes=150))

# Batch 16 (the paper's) = 8 GPUs x 2 images (the official code's split; 4 GPUs x 4 images is the
# same batch: `tools/dist_train.sh CONFIG 4 --cfg-options train_dataloader.batch_size=4`).
# 160k iterations x 16 images / 20,210 training images = ~127 epochs.
# With another total batch, `--cfg-options auto_scale_lr.enable=True` makes mmengine's Runner scale
# the lr linearly by (GPUs x batch_size) / 16.
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=16)

# AdamW as in the paper. No weight decay on norm layers (by type: the blocks' LayerNorms, the
# BatchNorms of the conv parts and, as a side effect, of the heads, which the official code
# decayed at 0.01), LayerScale (gamma1..3), the XCA temperature and the Fourier position encoding.
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={
            '.gamma1': dict(decay_mult=0.),
            '.gamma2': dict(decay_mult=0.),
            '.gamma3': dict(decay_mult=0.),
            '.temperature': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
        }))
# The official schedule: linear warm-up over 1500 iterations from lr x 1e-6, then poly decay with
# power 1.0 (linear) to 0 at the last iteration (mmseg 1.x's Swin recipes spell it the same way).
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=warmup_iters,
         end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=16000)
default_hooks = dict(checkpoint=dict(type='CrashSafeCheckpointHook', by_epoch=False, interval=16000,
                                     max_keep_ckpts=3))
# stop on a NaN/inf loss; RNG state in checkpoints for bit-identical resumes (deepvit_mm.runtime)
custom_hooks = [dict(type='FiniteLossHook'), dict(type='RNGStateHook')]
