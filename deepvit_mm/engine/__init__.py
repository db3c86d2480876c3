"""What deepvit_mm adds to mmengine's training runtime, registered in mmengine's registries on
import.

- ``hooks``: one hook a file: the neck's and heads' channels checked before a run, crash-safe
  checkpoints, a stop on non-finite losses, RNG state in checkpoints, the precision and thread
  count measured fastest on this CPU (``FastestStepHook``);
- ``optimizers``: mixed precision on CPU (``CPUAmpOptimWrapper``) and the fp16 recipes' float32
  fallback without a GPU (``fit_precision_to_device``); the optimizer-wrapper constructors
  (layer-wise lr decay, weight-decay exemptions);
- ``distributed``: distributed runs on CPU processes (gloo) through mmengine's Runner (``ddp``),
  sharded training (FSDP) through mmengine's FlexibleRunner, on GPUs and CPUs (``fsdp``);
- ``allocator``: the CPU runs' malloc (tcmalloc preloaded by the tools, glibc tuned);
- ``mmcv_ops``: whether mmcv's compiled ops run on the model's device (a GPU model beside an mmcv
  built for the CPU stops before the run).
"""
from .allocator import (
    allocator_note,
    cpu_allocator,
    keep_freed_cpu_memory,
    preload_tcmalloc,
    release_free_memory,
    setup_cpu_malloc,
)
from .distributed import (
    CPUDistributedDataParallel,
    CPUFullyShardedDataParallel,
    GlobalNormFSDPStrategy,
    columnar_block_policy,
    setup_cpu_distributed,
)
from .hooks import (
    CheckConsumersHook,
    CheckpointWriteError,
    CrashSafeCheckpointHook,
    FastestStepHook,
    FiniteLossHook,
    RNGStateHook,
)
from .mmcv_ops import mmcv_ops_device_problem
from .optimizers import (
    ColumnarLayerDecayOptimizerConstructor,
    CPUAmpOptimWrapper,
    NoDecayOnScalesOptimizerConstructor,
    fit_precision_to_device,
)

__all__ = ['CheckConsumersHook', 'CrashSafeCheckpointHook', 'CheckpointWriteError',
           'FiniteLossHook', 'RNGStateHook', 'FastestStepHook', 'CPUAmpOptimWrapper',
           'fit_precision_to_device', 'mmcv_ops_device_problem',
           'ColumnarLayerDecayOptimizerConstructor', 'NoDecayOnScalesOptimizerConstructor',
           'CPUDistributedDataParallel', 'setup_cpu_distributed', 'CPUFullyShardedDataParallel',
           'GlobalNormFSDPStrategy', 'columnar_block_policy', 'keep_freed_cpu_memory',
           'cpu_allocator', 'preload_tcmalloc', 'setup_cpu_malloc', 'allocator_note',
           'release_free_memory']
