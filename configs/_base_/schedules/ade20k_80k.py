# ade20k_160k.py cut to 80k iterations, Semantic FPN's schedule in the XCiT paper (Table 6):
# 80k iterations x 16 images / 20,210 training images = ~63 epochs. mmseg ships Semantic FPN on
# ADE20k only with 160k iterations (sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py).
_base_ = './ade20k_160k.py'
max_iters = 80000

# the same warm-up, the linear decay ending at max_iters
param_scheduler = [_base_.param_scheduler[0], dict(_base_.param_scheduler[1], end=max_iters + 1)]
train_cfg = dict(max_iters=max_iters, val_interval=max_iters // 10)
default_hooks = dict(checkpoint=dict(interval=max_iters // 10))
