# UperNet 160k on ADE20k with BEiT-B/16 (ImageNet-22k self-supervised pretraining, ImageNet-22k
# fine-tuning), 640x640 crops: BEiT's segmentation recipe (Bao et al., "BEiT: BERT Pre-Training of
# Image Transformers", ICLR 2022) as mmseg 1.x publishes it
# (configs/beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py over _base_/models/upernet_beit.py).
# mmseg's reported figures for that config (its configs/beit/README.md; ADE20k val):
# mIoU 53.08, 53.84 multi-scale with flip.
#
# What it sets, here: timm's BEiT-B/16 built for 640x640 inputs (the 14x14 relative position bias
# tables resized to 40x40 at load by timm's filter), drop path 0.1, LayerScale 0.1, taps at blocks
# 4/6/8/12 (3, 5, 7, 11) rescaled to strides 4/8/16/32 by ConvT-BN-GELU-ConvT / ConvT / identity /
# max-pool (deepvit_mm's default adapter, which is mmseg's Feature2Pyramid); UPerHead of 768
# channels, an FCN auxiliary head (256 channels, one conv) on the stride-16 level, SyncBN;
# ADE20k's 640x640 pipeline, sliding-window inference (640 windows, stride 426); AdamW lr 3e-5,
# betas (0.9, 0.999), weight decay 0.05, layer-wise lr decay 0.9 over the 12 blocks; batch 16
# (8 GPUs x 2 images); 160k iterations: a 1500-iteration linear warm-up from x1e-6, then a linear
# decay to 0 (mmseg's PolyLR from iteration 1500).
# Weight decay: 0 for biases, 1-d parameters (norms, LayerScale), the class token and the
# position embedding, as mmseg's constructor; deepvit_mm's also exempts the relative position
# bias tables (timm's Beit.no_weight_decay names them), which mmseg's decays.
_base_ = [
    './_base_/models/upernet.py',
    './_base_/upstream/mmseg/_base_/datasets/ade20k_640x640.py',
    './_base_/upstream/mmseg/_base_/default_runtime.py',
    './_base_/upstream/mmseg/_base_/schedules/schedule_160k.py',
    './_base_/default_runtime.py',
]

# The official BEiT-B/16 pt22k-ft22k release (microsoft/unilm, beit/), fetched once into torch's hub
# cache and checked; timm's copy loads too ('hf-hub:timm/beit_base_patch16_224.in22k_ft_in22k'),
# or a local path.
pretrained = ('https://conversationhub.blob.core.windows.net/beit-share-public/beit/'
              'beit_base_patch16_224_pt22k_ft22k.pth')
crop_size = (640, 640)
max_iters = 160000
warmup_iters = 1500

model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,  # the base's ResNet weights; BEiT's come through backbone.init_cfg
    backbone=dict(
        _delete_=True,  # drop the ResNet arguments
        type='TimmBEiT',
        arch='beit_base_patch16_224',
        img_size=640,
        drop_path_rate=0.1,
        # SyncBN in the pyramid adapter, reverted to BN by mmengine's Runner when not distributed
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[768] * 4, channels=768),
    auxiliary_head=dict(in_channels=768, channels=256, num_convs=1, in_index=2),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(426, 426)))

# Batch 16 = 8 GPUs x 2 images; another total batch: tools/train.py --auto-scale-lr
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=16)

optim_wrapper = dict(
    _delete_=True,  # drop the base's SGD
    type='OptimWrapper',
    constructor='ColumnarLayerDecayOptimizerConstructor',
    optimizer=dict(type='AdamW', lr=3e-5, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(decay_rate=0.9, num_layers=12))
del _base_.paramwise_cfg  # the XCiT rule of ./_base_/default_runtime.py: not this recipe's
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', power=1.0, begin=warmup_iters, end=max_iters, eta_min=0.0,
         by_epoch=False),
]
# validation and a checkpoint every 10 % of the schedule
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters // 10)
default_hooks = dict(
    checkpoint=dict(_base_.checkpoint_hook, by_epoch=False, interval=max_iters // 10))
del _base_.checkpoint_hook
