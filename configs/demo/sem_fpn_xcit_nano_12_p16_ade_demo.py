# Demo: XCiT-N12/16 Semantic FPN trained from scratch on the embedded ADE20k-format scenes
# (tools/make_ade_demo_data.py data/ade_demo: 300 training / 60 held-out validation images, 256 px
# high, ADE20k label ids; 5 of ADE20k's classes occur: sky, floor, box, tent, ball). The data path
# is the recipes' (mmseg's ADE20KDataset with reduce_zero_label, IoUMetric), scaled from
# 512-px to 256-px images and cut to those 5 classes (metainfo; mmseg maps the other ids to 255).
# Sized for 2 CPU cores: 64-channel FPN and head, 192x192 crops, batch 8, 500 iterations (4,000
# crops, ~13 passes over the 300 training images). Evaluates mIoU on the validation split (whole
# images, unpadded) at the end of training.
_base_ = [
    '../_base_/upstream/mmseg/_base_/models/fpn_r50.py',
    '../_base_/upstream/mmseg/_base_/default_runtime.py',
    '../_base_/default_runtime.py',
]

classes = ('sky', 'floor', 'box', 'tent', 'ball')  # deepvit_tools.demo_data.ADE_DEMO_CLASSES
data_root = 'data/ade_demo'
crop_size = (192, 192)
channels = 64  # FPN and head
max_iters = 500
batch_size = 8

norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        _delete_=True,
        type='XCiT',
        arch='nano_12_p16',
        norm_cfg=norm_cfg,
        pad_input=False,  # as the recipes: validation images go through unpadded
        init_cfg=None),  # from scratch: no hub access here; see README for ImageNet weights
    neck=dict(in_channels=[128] * 4, out_channels=channels),
    decode_head=dict(in_channels=[channels] * 4, channels=channels, num_classes=len(classes),
                     norm_cfg=norm_cfg))

# ADE20k's pipeline (configs/_base_/datasets/ade20k.py in mmseg) with the scale halved
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(1024, 256), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(1024, 256), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
dataset = dict(type='ADE20KDataset', data_root=data_root, metainfo=dict(classes=classes))
train_dataloader = dict(
    batch_size=batch_size,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(**dataset, pipeline=train_pipeline,
                 data_prefix=dict(img_path='images/training', seg_map_path='annotations/training')))
val_dataloader = dict(
    batch_size=1,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(**dataset, pipeline=test_pipeline,
                 data_prefix=dict(img_path='images/validation',
                                  seg_map_path='annotations/validation')))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

# The recipes' optimizer (AdamW, their weight-decay rules: ../_base_/default_runtime.py) with a
# from-scratch learning rate and a short warm-up.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=_base_.paramwise_cfg,
    clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=50, end=max_iters),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    checkpoint=dict(_base_.checkpoint_hook, by_epoch=False, interval=max_iters, max_keep_ckpts=1),
    visualization=dict(type='SegVisualizationHook'))  # tools/test.py --show-dir draws with it
del _base_.checkpoint_hook, _base_.paramwise_cfg  # used: not left in the resolved config
randomness = dict(seed=0)
auto_scale_lr = dict(enable=False, base_batch_size=batch_size)
