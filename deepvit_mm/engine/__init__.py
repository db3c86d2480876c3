"""What deepvit_mm adds to mmengine's training runtime, one module per job (registered on import).

- ``hooks``: the neck's and heads' channels checked before a run, crash-safe checkpoints, a stop
  on non-finite losses, RNG state in checkpoints;
- ``amp``: mixed precision on CPU (``CPUAmpOptimWrapper``) and
  the fp16 recipes' float32 fallback without a GPU (``fit_precision_to_device``);
- ``fastest_step``: a training run in the precision and thread count measured fastest on this CPU;
- ``distributed``: distributed runs on CPU processes (gloo) through mmengine's Runner;
- ``sharded``: sharded training (FSDP) through mmengine's FlexibleRunner, on GPUs and CPUs;
- ``allocator``: the CPU runs' malloc (tcmalloc preloaded by the tools, glibc tuned);
- ``config``: reading a config and building its model as mmdet's and mmseg's tools do.
"""
from .allocator import (
    MALLOC_ENV,
    allocator_note,
    cpu_allocator,
    find_tcmalloc,
    keep_freed_cpu_memory,
    preload_tcmalloc,
    release_free_memory,
    setup_cpu_malloc,
)
from .amp import CPUAmpOptimWrapper, fit_precision_to_device
from .config import (
    PALETTES,
    VIS_BACKENDS,
    build_from_config,
    build_inferencer,
    enable_auto_scale_lr,
    enable_tta,
    enable_visualization,
    load_config,
    model_index,
    num_classes_of,
    prepare_config,
    read_config,
    resolve_model,
    run_inferencer,
    set_test_out,
    set_vis_backends,
    task_of,
    task_registry,
    vis_backend_types,
)
from .distributed import CPUDistributedDataParallel, setup_cpu_distributed
from .fastest_step import FastestStepHook
from .hooks import (
    CheckConsumersHook,
    CheckpointWriteError,
    CrashSafeCheckpointHook,
    FiniteLossHook,
    RNGStateHook,
)
from .sharded import CPUFullyShardedDataParallel, GlobalNormFSDPStrategy, columnar_block_policy

__all__ = ['CheckConsumersHook', 'CrashSafeCheckpointHook', 'CheckpointWriteError',
           'FiniteLossHook', 'RNGStateHook',
           'CPUAmpOptimWrapper', 'fit_precision_to_device', 'FastestStepHook',
           'CPUDistributedDataParallel', 'setup_cpu_distributed',
           'CPUFullyShardedDataParallel', 'GlobalNormFSDPStrategy', 'columnar_block_policy',
           'keep_freed_cpu_memory', 'cpu_allocator', 'find_tcmalloc', 'preload_tcmalloc',
           'setup_cpu_malloc', 'allocator_note', 'release_free_memory', 'MALLOC_ENV',
           'prepare_config', 'task_of', 'task_registry', 'read_config', 'load_config',
           'build_from_config', 'num_classes_of', 'enable_visualization',
           'VIS_BACKENDS', 'vis_backend_types', 'set_vis_backends', 'enable_tta',
           'enable_auto_scale_lr', 'set_test_out', 'model_index', 'resolve_model', 'PALETTES',
           'build_inferencer', 'run_inferencer']
