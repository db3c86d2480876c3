# Mask R-CNN 3x on COCO, everything but the backbone: the detection recipe of the XCiT paper (Table
# 5, section 4.2), which the CaiT recipes apply unchanged (CaiT's paper has no detection results).
#
# mmdet's Swin-T 3x recipe already has all of it: Mask R-CNN + FPN, COCO instances (118k train /
# 5k val, bbox + segm evaluation), DETR's multi-scale training augmentation (random resize, or
# resize-crop-resize; shorter side 480..800, longer side <= 1333), AdamW lr 1e-4 weight decay
# 0.05, 36 epochs with lr x0.1 after epochs 27 and 33.
# Overridden here to train what the official XCiT configs (facebookresearch/xcit,
# detection/configs/xcit/mask_rcnn_xcit_*_3x_coco.py, mmdet 2.11) trained: their weight-decay rule
# (../default_runtime.py), their 500-iteration warm-up (Swin's mmdet 3 recipe has 1,000), fp16
# mixed precision with dynamic loss scaling; and the batch split, the checkpoints kept. The model
# bases (../mask_rcnn_{xcit,cait}_3x_coco.py) put their backbone in place of Swin.
_base_ = ['../upstream/mmdet/swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py', '../default_runtime.py']

# Batch 16 (the paper's) = 8 GPUs x 2 images.
# 36 epochs x 118,287 images / 16 = 7,393 iterations an epoch x 36 = ~266k iterations.
# With another total batch, `tools/train.py --auto-scale-lr` (as mmdet's) makes mmengine's Runner
# scale the lr linearly by (GPUs x batch_size) / 16.
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

# Mixed precision as the official code trained (apex O1 through `DistOptimizerHook(use_fp16=True)`:
# float16 autocast, dynamic loss scaling). mmengine's AmpOptimWrapper needs a GPU; on a machine
# without one, tools/train.py trains in float32 and says so once in the log
# (deepvit_mm.engine.fit_precision_to_device).
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    dtype='float16',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    # ../default_runtime.py's rules in place of Swin's keys (absolute_pos_embed, ...)
    paramwise_cfg=dict(_base_.paramwise_cfg, _delete_=True))
# The official schedule (mmdet 2's schedule_1x.py base with step=[27, 33], 36 epochs): linear
# warm-up over 500 iterations from lr x 0.001, then x0.1 after epochs 27 and 33. mmengine's LinearLR
# reaches its end value at iteration `end - 1`, mmcv 1.x's warm-up at warmup_iters: end=501.
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=501),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1)
]
default_hooks = dict(checkpoint=dict(_base_.checkpoint_hook, interval=1))  # every epoch
del _base_.checkpoint_hook, _base_.paramwise_cfg  # used: not left in the resolved config

# Test-time augmentation (tools/test.py --tta), as mmdet's own *_tta.py configs define it: the test
# scale with and without a horizontal flip, merged by DetTTAModel (boxes of both views, NMS at IoU
# 0.5, 100 per image). mmdet 3.3's DetTTAModel merges boxes only, so with --tta the mask head is
# left out and bbox alone is evaluated (deepvit_mm.apis.enable_tta).
tta_model = dict(
    type='DetTTAModel',
    tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale=(1333, 800), keep_ratio=True)],
            # flipped before anything is padded, so that the boxes flip back exactly
            [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
            [dict(type='LoadAnnotations', with_bbox=True)],
            [dict(type='PackDetInputs',
                  meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor',
                             'flip', 'flip_direction'))],
        ])
]
