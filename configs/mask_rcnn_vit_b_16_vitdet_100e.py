# ViTDet Mask R-CNN with a plain ViT-B/16 (MAE ImageNet-1k weights): LSJ at 1024x1024, 100 epochs
# on COCO, as the ViTDet paper trained it (Li et al., "Exploring Plain Vision Transformer Backbones
# for Object Detection", ECCV 2022), from its published configs: detectron2's
# projects/ViTDet/configs/COCO/mask_rcnn_vitdet_b_100ep.py, in mmdet 3's words mmdet's
# projects/ViTDet/configs/vitdet_mask-rcnn_vit-b-mae_lsj-100e.py and lsj-100e_coco-instance.py.
# Paper (detectron2's ViTDet model zoo, ViT-B, MAE IN-1k, COCO val2017): box AP 51.6, mask AP 45.9.
#
# What ViTDet sets, here: timm's ViT-B/16 built for 1024x1024 inputs (the 14x14 MAE position
# embedding resampled to 64x64 at load); attention within 14x14-patch windows in every block but
# 2, 5, 8 and 11 (global); no class token; drop path 0.1; its simple feature pyramid from the last
# block (ConvT-LN-GELU-ConvT to stride 4, ConvT to 8, the block at 16, max-pool to 32), LayerNorm
# (LN2d) in the pyramid, neck and heads; an RPN head of 2 convs, a 4-conv + 1-fc box head; large
# scale jitter (resize x0.1..2.0, 1024 crops, padded to 1024); AdamW lr 1e-4, betas (0.9, 0.999),
# weight decay 0.1, layer-wise lr decay 0.7 over the 12 blocks; batch 64; 184,375 iterations
# (100 ep = 184375 iters * 64 images/iter / 118000 images/ep) with a 250-iteration linear warm-up
# from x0.001 and x0.1 at 88 and 96 epochs (163,889 and 177,546 iterations); fp16 mixed precision.
#
# Where it differs from ViTDet, each because timm's ViT or mmdet's core lacks the piece:
# - no decomposed relative position embedding in the attention (ViTDet's use_rel_pos=True; timm's
#   VisionTransformer has none, and MAE's weights have none: ViTDet starts it at zero);
# - mmdet's FPN over the pyramid's four levels (a top-down path, 768 input channels at every level)
#   in place of ViTDet's SimpleFPN (1x1 and 3x3 convs per level, no top-down; its stride-4 and -8
#   levels narrowed to 192 and 384 channels), which mmdet keeps in projects/, not in its core;
# - weight decay: ViTDet exempts norms and the position embedding; deepvit_mm's layer-decay
#   constructor also exempts biases and every 1-d parameter (as mmdet's projects/ViTDet does).
_base_ = [
    './_base_/upstream/mmdet/_base_/models/mask-rcnn_r50_fpn.py',
    './_base_/upstream/mmdet/_base_/datasets/coco_instance.py',
    './_base_/upstream/mmdet/_base_/default_runtime.py',
    './_base_/default_runtime.py',
]

# MAE's ViT-B/16 (facebookresearch/mae), fetched once into torch's hub cache and checked; timm's
# copy loads too ('hf-hub:timm/vit_base_patch16_224.mae'), or a local path. Its class token is
# dropped and its position embedding resampled to the 64x64 grid (the load report says both).
pretrained = 'https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth'
image_size = (1024, 1024)
norm_cfg = dict(type='LN2d', requires_grad=True)  # timm's LayerNorm2d, as ViTDet's LN2d

model = dict(
    data_preprocessor=dict(
        pad_size_divisor=32,
        batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]),
    backbone=dict(
        _delete_=True,
        type='TimmViT',
        arch='vit_base_patch16_224',
        img_size=1024,
        window_size=14,  # global_blocks: ViTDet's 2, 5, 8, 11 (the default)
        drop_path_rate=0.1,
        pyramid='simple',
        norm_cfg=norm_cfg,
        with_cp=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[768] * 4, out_channels=256, norm_cfg=norm_cfg),
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=dict(type='Shared4Conv1FCBBoxHead', conv_out_channels=256, norm_cfg=norm_cfg),
        mask_head=dict(norm_cfg=norm_cfg)))

# Large scale jitter, as ViTDet (lsj-100e_coco-instance.py)
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size,
         recompute_bbox=True, allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
# Batch 64 = 16 GPUs x 4 images; another total batch: tools/train.py --auto-scale-lr
train_dataloader = dict(
    batch_size=4, num_workers=8, sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(filter_cfg=dict(filter_empty_gt=True, min_size=32), pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=64)

optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    dtype='float16',
    constructor='ColumnarLayerDecayOptimizerConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(decay_rate=0.7, num_layers=12))
del _base_.paramwise_cfg  # the XCiT rule of ../_base_/default_runtime.py: not this recipe's

# 100 ep = 184375 iters * 64 images/iter / 118000 images/ep; x0.1 at 88 and 96 epochs
max_iters = 184375
interval = 5000
param_scheduler = [
    # detectron2's warm-up reaches x1 at iteration 250; mmengine's LinearLR at `end - 1`
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=251),
    dict(type='MultiStepLR', begin=0, end=max_iters, by_epoch=False,
         milestones=[163889, 177546], gamma=0.1),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=interval,
                 dynamic_intervals=[(max_iters // interval * interval + 1, max_iters)])
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(checkpoint=dict(_base_.checkpoint_hook, by_epoch=False, interval=interval))
del _base_.checkpoint_hook
log_processor = dict(by_epoch=False)
