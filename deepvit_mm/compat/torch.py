"""The PyTorch APIs that differ between the oldest and newest torch deepvit_mm supports.

Tested at both ends (``deepvit_mm.version.TESTED``): torch 2.1.0, the release OpenMMLab's
mmcv 2.1.0 wheels for torch 2.1 are built against, and torch 2.13.0. Each function picks the API
by what the installed torch has (feature detection, not a version table), so a torch in between takes
whichever of the two tested paths its API supports; ONNX export alone goes by version, as a torch
in between has the API and fails (``deepvit_mm.version.FEATURE_FLOORS``).

* ``autocast_enabled`` / ``autocast_dtype``: ``torch.is_autocast_enabled(device_type)`` and
  ``torch.get_autocast_dtype`` (2.4+); torch 2.1 has the CUDA-only argument-less forms and
  ``is_autocast_cpu_enabled`` / ``get_autocast_cpu_dtype``.
* ``cpu_fsdp_problem``: FullyShardedDataParallel on CPU processes (gloo) runs on torch 2.13 and
  fails on 2.1 (by version, ``version.FEATURE_FLOORS``).
* ``blocks_compile_problem``: the backbones' ``compile_blocks`` needs ``nn.Module.compile`` (in
  place: the state dict keeps its keys) and dynamo's ``inline_inbuilt_nn_modules`` (every block's
  copy of a part one graph); torch 2.1 has the first only.
* ``BatchNormBase``, ``ConvBase``: the base classes of batch norms and convolutions (private
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
from typing import Optional

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

from ..version import FEATURE_FLOORS, release

__all__ = [
    'TORCH_VERSION', 'autocast_enabled', 'autocast_dtype', 'cpu_fsdp_problem',
    'blocks_compile_problem', 'inductor_cache_problem', 'BatchNormBase', 'ConvBase', 'in_backward',
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

# --------------------------------------------------------------------------------------------
# private APIs
# --------------------------------------------------------------------------------------------
def in_backward() -> bool:
    """Whether autograd's backward pass is running (a checkpointed block being recomputed)."""
    # reason: the only time a module runs forward while a graph task executes; torch.utils.
    # checkpoint tells its recomputation apart by the same private call (torch 2.1 to 2.13)
    return torch._C._current_graph_task_id() != -1


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
