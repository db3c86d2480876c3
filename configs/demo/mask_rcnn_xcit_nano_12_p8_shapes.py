# Demo: XCiT-N12/8 Mask R-CNN trained from scratch on the embedded synthetic shapes dataset
# (tools/make_demo_data.py data/shapes: 400 train / 60 held-out val images, 256x256, 3 classes),
# sized for 2 CPU cores (docs/training.md#the-detection-demo has the numbers):
# 8 of XCiT-N12/8's 12 blocks (taps 1, 3, 5, 7), 64-channel FPN and heads, one anchor ratio (the
# shapes' boxes are near-square), 64 RoIs per image, half of them positive where there are that
# many, class-agnostic box regression with a GIoU loss, and 1,100 steps of batch 2 (more updates
# learned more than half as many steps of batch 4 for the same images seen; `make demo`'s time with
# FastestStepHook's choice on each CPU measured: docs/training.md#the-detection-demo).
_base_ = [
    '../_base_/upstream/mmdet/_base_/models/mask-rcnn_r50_fpn.py',
    '../_base_/upstream/mmdet/_base_/default_runtime.py',
    '../_base_/default_runtime.py',
]

classes = ('circle', 'square', 'triangle')
data_root = 'data/shapes/'
image_size = 256
channels = 64  # FPN and heads
max_iters = 1100
warmup = 100
lr = 1.5e-3  # AdamW, from scratch
batch_size = 2

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(
        _delete_=True,
        type='XCiT',
        arch='nano_12_p8',
        out_indices=(1, 3, 5, 7),  # blocks 8-11 are not built
        norm_cfg=dict(type='BN', requires_grad=True),
        init_cfg=None),  # from scratch: no hub access here; see README for ImageNet weights
    neck=dict(in_channels=[128] * 4, out_channels=channels),
    # one anchor ratio: inputs must give every level at least 2 anchors (over 64 px), as mmdet
    # 3.3's RPN fails on a level with a single one
    rpn_head=dict(in_channels=channels, feat_channels=channels,
                  anchor_generator=dict(ratios=[1.0])),
    roi_head=dict(
        # 2x2 samples per RoIAlign bin instead of the adaptive count, whose CPU backward took a
        # large part of a step; with a fixed count CPUSingleRoIExtractor runs every level's
        # RoIAlign as one multithreaded gather (equal outputs; the RoI heads' time per step before
        # and after: docs/speed.md#the-detection-demos-training-step)
        bbox_roi_extractor=dict(type='CPUSingleRoIExtractor', out_channels=channels,
                                roi_layer=dict(sampling_ratio=2)),
        # GIoU loss on the decoded boxes (mmdet's faster-rcnn_r50_fpn_giou_1x_coco.py): +0.03
        # held-out bbox mAP over L1 on the deltas here (docs/training.md#the-detection-demo)
        bbox_head=dict(in_channels=channels, fc_out_channels=256, num_classes=len(classes),
                       reg_class_agnostic=True, reg_decoded_bbox=True,
                       loss_bbox=dict(type='GIoULoss', loss_weight=10.0)),
        mask_roi_extractor=dict(type='CPUSingleRoIExtractor', out_channels=channels,
                                roi_layer=dict(sampling_ratio=2)),
        mask_head=dict(num_convs=2, in_channels=channels, conv_out_channels=channels,
                       num_classes=len(classes))),
    train_cfg=dict(rpn_proposal=dict(nms_pre=1000, max_per_img=500),
                   rcnn=dict(sampler=dict(num=64, pos_fraction=0.5))),
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

# val_begin past the end: no evaluation inside training; tools/test.py evaluates the last checkpoint
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters,
                 val_begin=max_iters + 1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=lr, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=_base_.paramwise_cfg,  # the recipes' weight-decay rules
    clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=warmup),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=warmup, end=max_iters, eta_min=lr / 100),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(_base_.checkpoint_hook, by_epoch=False, interval=max_iters, max_keep_ckpts=1))
del _base_.checkpoint_hook, _base_.paramwise_cfg  # used: not left in the resolved config
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
auto_scale_lr = dict(enable=False, base_batch_size=batch_size)
