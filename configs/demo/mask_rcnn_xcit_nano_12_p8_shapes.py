# Demo: XCiT-N12/8 Mask R-CNN trained from scratch on the embedded synthetic shapes dataset
# (tools/make_demo_data.py data/shapes: 400 train / 60 held-out val images, 256x256, 3 classes).
# Sized for 2 CPU cores: a stock Mask R-CNN spends most of a CPU step in its RoI heads, so this
# one samples 128 RoIs per image and uses 128-channel FPN/heads and a 2-conv mask head
# (~1.4 s a step at batch 4 instead of ~4.5 s on a 2-core Sapphire Rapids; ~2.5 s on a
# 2-core AMD EPYC). Evaluates COCO bbox/segm mAP on the val split at
# the end of training.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/default_runtime.py',
    '../_base_/default_runtime.py',
]

classes = ('circle', 'square', 'triangle')
data_root = 'data/shapes/'
image_size = 256
channels = 128  # FPN and heads
max_iters = 250
lr = 8e-4  # from scratch, 350 steps: 4e-4 reached bbox/segm mAP 0.33/0.31, 8e-4 0.44/0.42
batch_size = 4

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(
        _delete_=True,
        type='XCiT',
        arch='nano_12_p8',
        norm_cfg=dict(type='BN', requires_grad=True),
        init_cfg=None),  # from scratch: no hub access here; see README for ImageNet weights
    neck=dict(in_channels=[128] * 4, out_channels=channels),
    rpn_head=dict(in_channels=channels, feat_channels=channels),
    roi_head=dict(
        # 2x2 samples per RoIAlign bin instead of the adaptive count: its CPU backward was ~15 %
        # of a step
        bbox_roi_extractor=dict(out_channels=channels, roi_layer=dict(sampling_ratio=2)),
        bbox_head=dict(in_channels=channels, fc_out_channels=256, num_classes=len(classes)),
        mask_roi_extractor=dict(out_channels=channels, roi_layer=dict(sampling_ratio=2)),
        mask_head=dict(num_convs=2, in_channels=channels, conv_out_channels=channels,
                       num_classes=len(classes))),
    train_cfg=dict(rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=batch_size,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(
        type='CocoDataset',
        data_root=data_root,
        metainfo=dict(classes=classes),
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=8),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=1,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='CocoDataset',
        data_root=data_root,
        metainfo=dict(classes=classes),
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        test_mode=True,
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(
    type='CocoMetric',
    ann_file=data_root + 'annotations/instances_val.json',
    metric=['bbox', 'segm'],
    format_only=False)
test_evaluator = val_evaluator

train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=lr, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=_base_.paramwise_cfg,  # the recipes' weight-decay rules
    clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=50, end=max_iters, eta_min=lr / 100),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25),
    checkpoint=dict(_base_.checkpoint_hook, by_epoch=False, interval=max_iters, max_keep_ckpts=1))
del _base_.checkpoint_hook, _base_.paramwise_cfg  # used: not left in the resolved config
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
auto_scale_lr = dict(enable=False, base_batch_size=batch_size)
