"""The PyTorch APIs that differ between the oldest and newest torch deepvit_mm supports.

Tested at both ends (``deepvit_mm.version.TESTED``): torch 2.1.0, the release OpenMMLab's
mmcv 2.1.0 wheels for torch 2.1 are built against, and torch 2.13.0. Each function picks the API
by what the installed torch has (feature detection, not a version table), so a torch in between takes
whichever of the two tested paths its API supports; ONNX export alone goes by version, as a torch
in between has the API and fails (``deepvit_mm.version.FEATURE_FLOORS``).

* ``autocast_enabled`` / ``autocast_dtype``: ``torch.is_autocast_enabled(device_type)`` and
  ``torch.get_autocast_dtype`` (2.4+); torch 2.1 has the CUDA-only argument-less forms and
  ``is_autocast_cpu_enabled`` / ``get_autocast_cpu_dtype``.
* ``cpu_grad_scaler`` / ``cpu_float16_training_problem``: float16 training on CPU needs
  ``torch.amp.GradScaler('cpu')`` (2.3+) and float16 CPU autocast; torch 2.1 has neither (its CPU
  autocast turns itself off for float16), so there float16 is refused with what to do.
* ``cpu_fsdp_problem``: FullyShardedDataParallel on CPU processes (gloo) runs on torch 2.13 and
  fails on 2.1 (by version, ``version.FEATURE_FLOORS``).
* ``blocks_compile_problem``: the backbones' ``compile_blocks`` needs ``nn.Module.compile`` (in
  place: the state dict keeps its keys) and dynamo's ``inline_inbuilt_nn_modules`` (every block's
  copy of a part one graph); torch 2.1 has the first only.
* ``NORM_LAYERS``: the normalisation layer types, with ``nn.RMSNorm`` where it exists (2.4+);
  ``BatchNormBase``, ``ConvBase``: the base classes of batch norms and convolutions (private
  names in torch).
* ``sdpa_takes_float_masks_under_autocast``: ``F.scaled_dot_product_attention`` under autocast with
  a float additive mask (timm's BEiT passes its relative position bias so): torch 2.13 casts
  them, torch 2.1 refuses ("Expected attn_mask dtype to be bool or to match query dtype"). Probed
  once on two tiny CPU tensors.

Private torch APIs, each with the reason it is used and the releases it was tested on (2.1.0,
2.13.0):

* ``in_backward``: ``torch._C._current_graph_task_id``, as ``torch.utils.checkpoint`` uses it.
* ``cpu_has_bfloat16``: ``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``
  (torch 2.4+; torch 2.1: the CPU's flags in ``/proc/cpuinfo``).
"""
import functools
import os
from typing import Any, Optional, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
from torch.nn.modules.conv import _ConvNd

from ..version import FEATURE_FLOORS, release

__all__ = [
    'TORCH_VERSION', 'autocast_enabled', 'autocast_dtype',
    'cpu_grad_scaler', 'cpu_float16_training_problem',
    'cpu_fsdp_problem', 'blocks_compile_problem', 'inductor_cache_problem', 'NORM_LAYERS',
    'BatchNormBase', 'ConvBase', 'in_backward', 'cpu_has_bfloat16',
    'sdpa_takes_float_masks_under_autocast'
]


#: the running torch's release number, ``(2, 13, 0)`` for ``2.13.0+cpu`` and ``2.13.0rc1`` alike:
#: features are gated by release, and a pre-release or vendor build of one has its features
TORCH_VERSION = release(torch.__version__).release


def _autocast_api_takes_device() -> bool:
    try:
        torch.is_autocast_enabled('cpu')
        return True
    except TypeError:  # torch < 2.4: is_autocast_enabled() takes no argument
        return False


_DEVICE_API = _autocast_api_takes_device()


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False for types autocast does not know, such as
    ``meta``, on which FLOP counting runs the model)."""
    if _DEVICE_API:
        try:
            return torch.is_autocast_enabled(device_type)
        except RuntimeError:  # "unknown device type for autocast"
            return False
    if device_type == 'cpu':
        return torch.is_autocast_cpu_enabled()
    if device_type == 'cuda':
        return torch.is_autocast_enabled()
    return False


def autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype autocast computes in on ``device_type`` (meaningful where it is enabled)."""
    if _DEVICE_API:
        return torch.get_autocast_dtype(device_type)
    if device_type == 'cpu':
        return torch.get_autocast_cpu_dtype()
    return torch.get_autocast_gpu_dtype()


def cpu_float16_training_problem() -> Optional[str]:
    """None if this torch trains in float16 on CPU (autocast + loss scaling), else why not."""
    if not hasattr(torch.amp, 'GradScaler'):  # torch < 2.3: torch.cuda.amp.GradScaler only
        return (f"torch {torch.__version__} has no CPU loss scaler (torch.amp.GradScaler('cpu'), "
                'torch >= 2.3) and no float16 CPU autocast: train in float32 or bfloat16 there, '
                'or in float16 on a GPU')
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # a torch without it warns and turns autocast off
        with torch.autocast('cpu', dtype=torch.float16):
            on = autocast_enabled('cpu') and autocast_dtype('cpu') == torch.float16
    if not on:
        return f'torch {torch.__version__} has no float16 CPU autocast'
    return None


def cpu_grad_scaler(enabled: bool = True, **kwargs: Any) -> Any:
    """A gradient scaler for CPU training: torch's ``GradScaler('cpu')``; disabled (a pass-through
    that scales nothing, for bfloat16), any torch's.

    Args:
        enabled (bool): Scale losses (float16). Default: True.
        kwargs: ``GradScaler`` arguments (``init_scale``, ``growth_interval``, ...).

    Raises:
        RuntimeError: ``enabled`` on a torch without CPU loss scaling
            (``cpu_float16_training_problem``).
    """
    if hasattr(torch.amp, 'GradScaler'):
        return torch.amp.GradScaler('cpu', enabled=enabled, **kwargs)
    if enabled:
        raise RuntimeError(cpu_float16_training_problem())
    return torch.cuda.amp.GradScaler(enabled=False)  # torch < 2.3; disabled, it touches no GPU


def cpu_fsdp_problem() -> Optional[str]:
    """None if FullyShardedDataParallel runs on CPU processes with this torch
    (``FEATURE_FLOORS['sharded training on CPU']``), else why not and what to do instead."""
    _, lowest, known = FEATURE_FLOORS['sharded training on CPU']
    if TORCH_VERSION >= release(lowest).release:
        return None
    return (f'sharded training (FSDPStrategy) on CPU is tested with torch {lowest}; '
            f'{known}. Train with DDP there (tools/dist_train.sh without the FSDP config), or '
            f'with torch >= {lowest}; on GPUs FSDP is mmengine\'s own.')


def blocks_compile_problem() -> Optional[str]:
    """None if ``torch.compile`` compiles a module in place (``nn.Module.compile``) and traces
    every block's copy of a part as one graph (dynamo's ``inline_inbuilt_nn_modules``, always on in
    torch 2.13; torch 2.1 has ``nn.Module.compile`` without it), else why not and what to do
    instead (the backbones' ``compile_blocks``)."""
    if hasattr(nn.Module, 'compile'):
        import importlib
        import warnings
        dynamo_config = importlib.import_module('torch._dynamo.config')
        with warnings.catch_warnings():  # deprecated where it is always on (torch 2.13: True)
            warnings.simplefilter('ignore', FutureWarning)
            if getattr(dynamo_config, 'inline_inbuilt_nn_modules', False):
                return None
    return (f'torch {torch.__version__} compiles each block\'s copy of a part as a graph of its '
            'own (torch 2.1.0, XCiT-N12/8\'s 8 blocks: 16 compilations and 54 s before the first '
            'step, against 2 and 21 s with torch 2.13.0, whose dynamo inlines the modules). Leave '
            'compile_blocks off here, or use a torch with nn.Module.compile and '
            'torch._dynamo.config.inline_inbuilt_nn_modules (torch 2.13.0 is tested).')


def inductor_cache_problem() -> Optional[str]:
    """None unless torch's CPU kernels are capped by ``ATEN_CPU_CAPABILITY`` while
    ``torch.compile``'s kernels go to inductor's shared cache (``TORCHINDUCTOR_CACHE_DIR`` unset),
    else what goes wrong and what to set: the cache's keys do not tell the instruction sets apart,
    so a kernel compiled under another setting is loaded as it is (torch 2.13.0: a compiled timm
    MLP's outputs 69 % off under ``avx2`` with kernels compiled for AVX-512, and a crashed process
    the other way round; docs/training.md#compiling-the-backbone)."""
    isa = os.environ.get('ATEN_CPU_CAPABILITY', '')
    if not isa or isa == 'default' or os.environ.get('TORCHINDUCTOR_CACHE_DIR'):
        return None
    return (f'ATEN_CPU_CAPABILITY={isa} is set and torch.compile keeps its kernels in inductor\'s '
            'shared cache (TORCHINDUCTOR_CACHE_DIR is unset), whose keys do not tell the '
            'instruction sets apart: a kernel compiled there under another ATEN_CPU_CAPABILITY '
            'is loaded as it is and computes wrong values or crashes the process. Set '
            'TORCHINDUCTOR_CACHE_DIR to a folder of this setting\'s own, e.g. '
            f'/tmp/torchinductor_{isa}.')


# --------------------------------------------------------------------------------------------
# layers
# --------------------------------------------------------------------------------------------
#: the base classes of torch's batch norms (SyncBatchNorm included) and convolutions, private in
#: torch (``torch.nn.modules.batchnorm._BatchNorm``, ``conv._ConvNd``; mmcv tells layers apart by
#: the same classes)
BatchNormBase = _BatchNorm
ConvBase = _ConvNd

#: every normalisation layer type of this torch (``nn.RMSNorm``: torch >= 2.4)
NORM_LAYERS: Tuple[type, ...] = (_NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm) + (
    (nn.RMSNorm,) if hasattr(nn, 'RMSNorm') else ())


# --------------------------------------------------------------------------------------------
# private APIs
# --------------------------------------------------------------------------------------------
def in_backward() -> bool:
    """Whether autograd's backward pass is running (a checkpointed block being recomputed)."""
    # reason: the only time a module runs forward while a graph task executes; torch.utils.
    # checkpoint tells its recomputation apart by the same private call (torch 2.1 to 2.13)
    return torch._C._current_graph_task_id() != -1


def cpu_has_bfloat16() -> bool:
    """Whether torch computes bfloat16 natively on this CPU: the CPU has AVX512-BF16 or AMX and
    torch runs its AVX-512 kernels (not capped at AVX2 by ``ATEN_CPU_CAPABILITY``, as on an
    AVX2-only CPU)."""
    if not torch.backends.cpu.get_cpu_capability().startswith('AVX512'):
        return False
    # reason: torch.cpu exposes these checks only under private names (torch 2.4 to 2.13)
    checks = [getattr(torch.cpu, c, None) for c in ('_is_avx512_bf16_supported',
                                                    '_is_amx_tile_supported')]
    if any(c is not None for c in checks):
        return any(c() for c in checks if c is not None)
    try:  # torch 2.1 has neither check: the CPU's own flags (Linux)
        with open('/proc/cpuinfo') as f:
            flags = next((line.split() for line in f if line.startswith('flags')), [])
    except OSError:
        return False
    return 'avx512_bf16' in flags or 'amx_bf16' in flags


@functools.cache
def sdpa_takes_float_masks_under_autocast() -> bool:
    """Whether ``scaled_dot_product_attention`` accepts a float32 mask beside bfloat16 queries
    under CPU autocast (module docstring)."""
    q = torch.zeros(1, 1, 2, 2, dtype=torch.bfloat16)  # as a Linear's output under autocast
    try:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(2, 2))
    except RuntimeError:
        return False
    return True
