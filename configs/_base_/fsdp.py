# Sharded training (FSDP): any recipe trained through mmengine's FlexibleRunner with FSDPStrategy
# instead of the Runner with DDP. Each process holds 1/N of the weights, gradients and AdamW's
# moments (DDP: all of them); every trunk block is one FSDP unit (deepvit_mm's
# columnar_block_policy), the rest of the model the root unit. Checkpoints are written whole
# ('full': gathered on rank 0), so tools/test.py, load_from and the inferencers read them as any
# other. Use it as a second base after the recipe:
#   _base_ = ['../mask_rcnn_xcit_m24_8_3x.py', '../_base_/fsdp.py']
# On a machine without CUDA the processes run with gloo (torch >= 2.13). docs/training.md.
runner_type = 'FlexibleRunner'
# GlobalNormFSDPStrategy: mmengine's FSDPStrategy whose gradient clipping (clip_grad) computes
# DDP's norm and coefficient, bit for bit, not each process's shard's: a sharded run ends where a
# DDP run ends (deepvit_mm.engine.distributed.fsdp, docs/training.md).
strategy = dict(
    type='GlobalNormFSDPStrategy',
    model_wrapper=dict(auto_wrap_policy=dict(type='columnar_block_policy'), use_orig_params=True),
    state_dict_cfg='full')
