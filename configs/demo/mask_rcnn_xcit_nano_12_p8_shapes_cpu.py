# The detection demo as `make demo` trains it on a CPU: mask_rcnn_xcit_nano_12_p8_shapes.py in
# bfloat16 autocast or float32, with 1 thread or all, whichever FastestStepHook measures fastest on
# trial iterations early in the run on this CPU (deepvit_mm/engine/hooks/fastest_step_hook.py;
# docs/training.md#mixed-precision).
# The choice is logged and kept in the checkpoint; the base config trains in float32 throughout.
_base_ = ['./mask_rcnn_xcit_nano_12_p8_shapes.py']

optim_wrapper = dict(type='CPUAmpOptimWrapper', dtype='bfloat16')
custom_hooks = [*_base_.custom_hooks, dict(type='FastestStepHook')]
