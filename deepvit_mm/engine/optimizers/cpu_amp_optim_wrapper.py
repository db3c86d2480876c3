"""Mixed precision on CPU: ``CPUAmpOptimWrapper`` (bfloat16 autocast, or float16 with dynamic loss
scaling), and ``fit_precision_to_device`` for the fp16 recipes. mmcv's compiled ops, whose CPU
kernels take float32 only, run in float32 under the wrapper's autocast
(``mmcv_ops_in_float32``).

Where torch releases differ (the two tested stacks' torches): float16 training on CPU needs
``torch.amp.GradScaler('cpu')`` (torch 2.3+) and float16 CPU autocast; torch 2.1 has neither (its
CPU autocast turns itself off for float16), so there float16 is refused with what to do
(``cpu_float16_training_problem``; ``cpu_grad_scaler``). mmengine's ``AmpOptimWrapper.__init__``
asserts an accelerator (0.10.3, 0.10.7): the wrapper sets up what it would, its private
``_scale_update_param`` included (``_init_without_accelerator``). ``cpu_has_bfloat16``: whether
this CPU computes bfloat16 natively, which the wrapper and ``FastestStepHook`` ask.

The Mask R-CNN recipes train in float16 with dynamic loss scaling, as the official XCiT code did
(mmengine's ``AmpOptimWrapper``, which needs an accelerator). ``fit_precision_to_device`` turns
that into float32 on a machine without one, and says so.
"""
from contextlib import contextmanager
from typing import Any, Optional

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.device import is_cuda_available, is_mlu_available, is_musa_available, is_npu_available
from mmengine.logging import print_log
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from ...compat.torch import autocast_dtype, autocast_enabled
from .mmcv_ops_in_float32 import run_mmcv_ops_in_float32

__all__ = ['CPUAmpOptimWrapper', 'fit_precision_to_device', 'cpu_float16_training_problem']


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


def _init_without_accelerator(wrapper: AmpOptimWrapper, dtype: torch.dtype, loss_scaler: Any,
                              fixed_scale: Optional[float] = None, **kwargs) -> None:
    """Set ``wrapper`` up as ``AmpOptimWrapper.__init__`` would, which asserts an accelerator:
    ``OptimWrapper``'s arguments ``kwargs``, autocast ``dtype``, ``loss_scaler``, and the scale
    its ``update_params`` passes to the scaler's ``update`` (``fixed_scale``, or None: dynamic)."""
    OptimWrapper.__init__(wrapper, **kwargs)
    wrapper.cast_dtype = dtype
    wrapper.loss_scaler = loss_scaler
    wrapper._scale_update_param = fixed_scale


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` on CPU (mmengine's own refuses a machine without an
    accelerator): CPU autocast in ``dtype``; for float16 a ``GradScaler('cpu')`` with mmengine's
    dynamic loss scaling (backward, unscale for clipping, skipped steps on overflow, the scale in
    checkpoints), for bfloat16, which has float32's exponent range, none. mmcv's compiled ops, whose
    CPU kernels take float32 only, run in float32 inside it (``run_mmcv_ops_in_float32``).

    Args:
        dtype (str): ``'bfloat16'`` or ``'float16'`` (torch >= 2.3). Default: ``'bfloat16'``.
        loss_scale (str | float | dict): float16's scaler, as ``AmpOptimWrapper`` takes it:
            ``'dynamic'``, an initial scale (kept fixed) or ``GradScaler`` arguments. Ignored for
            bfloat16. Default: ``'dynamic'``.
        kwargs: ``OptimWrapper`` arguments.
    """

    def __init__(self, dtype: str = 'bfloat16', loss_scale: Any = 'dynamic', **kwargs) -> None:
        if dtype not in ('bfloat16', 'float16'):
            raise ValueError(f"CPUAmpOptimWrapper: dtype must be 'bfloat16' or 'float16', got "
                             f'{dtype!r}')
        fixed_scale = None
        if dtype == 'float16':
            if isinstance(loss_scale, float):
                fixed_scale, scaler = loss_scale, cpu_grad_scaler(init_scale=loss_scale)
            elif isinstance(loss_scale, dict):
                scaler = cpu_grad_scaler(**loss_scale)
            elif loss_scale == 'dynamic':
                scaler = cpu_grad_scaler()
            else:
                raise TypeError(f'loss_scale must be "dynamic", a float or a dict, got '
                                f'{loss_scale!r}')
        else:
            scaler = cpu_grad_scaler(enabled=False)
        _init_without_accelerator(self, getattr(torch, dtype), scaler, fixed_scale, **kwargs)
        #: False: float32, no autocast (``FastestStepHook`` sets it where float32 is faster)
        self.autocast = True
        run_mmcv_ops_in_float32()
        if self.cast_dtype == torch.bfloat16 and not cpu_has_bfloat16():
            print_log(f'--amp: this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native '
                      'bfloat16 (AVX512-BF16 or AMX): bfloat16 convolutions and matrix products '
                      'are emulated and much slower than float32 here.', logger='current',
                      level=30)

    @contextmanager
    def optim_context(self, model: nn.Module):
        with OptimWrapper.optim_context(self, model), \
                torch.autocast('cpu', dtype=self.cast_dtype, enabled=self.autocast):
            yield


def _has_accelerator() -> bool:
    # what mmengine's AmpOptimWrapper asserts
    return (is_cuda_available() or is_npu_available() or is_mlu_available()
            or is_musa_available())


def fit_precision_to_device(cfg: Config) -> Optional[str]:
    """Train a config's ``AmpOptimWrapper`` (float16 autocast, loss scaling: the Mask R-CNN
    recipes) in float32 where there is no accelerator, which mmengine's wrapper needs. Other
    wrappers, and machines with a GPU, are left as they are.

    Args:
        cfg (Config): A run's config; ``cfg.optim_wrapper`` is changed in place.

    Returns:
        str | None: What was changed, for the run's log (``tools/train.py`` logs it once), or None.
    """
    ow = cfg.get('optim_wrapper')
    if ow is None or ow.get('type') != 'AmpOptimWrapper' or _has_accelerator():
        return None
    dtype = ow.pop('dtype', None) or 'float16'
    for key in ('loss_scale', 'use_fsdp'):
        ow.pop(key, None)
    ow.type = 'OptimWrapper'
    return (f'precision: the config trains in {dtype} mixed precision (AmpOptimWrapper), which '
            'needs a GPU; this machine has none, so it trains in float32 (OptimWrapper). On CPU, '
            '--amp trains in bfloat16 autocast, and optim_wrapper.type=CPUAmpOptimWrapper '
            'optim_wrapper.dtype=float16 in float16 with dynamic loss scaling (torch >= 2.3; '
            'emulated, so slow, on CPUs without AVX512-FP16/AMX-FP16).')
