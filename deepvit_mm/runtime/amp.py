"""Mixed precision on CPU: ``CPUAmpOptimWrapper`` (bfloat16 autocast, or float16 with dynamic loss
scaling), mmcv's compiled ops under it, and ``fit_precision_to_device`` for the fp16 recipes.

``torch.autocast`` only knows PyTorch's own operators. The ops of ``mmcv.ops`` (NMS, RoIAlign,
deformable convolution, ...) are ``torch.autograd.Function`` s calling compiled kernels whose CPU
versions take float32/float64 only, so under CPU bfloat16 autocast they meet the bfloat16 outputs
of the layers before them and fail (``expected scalar type Float but found BFloat16``). On GPU
they have half-precision kernels and return the dtype they were given, which mmdet's heads rely
on (``roi_feats[inds] = roi_align(...)`` writes into a tensor of the feature maps' dtype).

``run_mmcv_ops_in_float32`` wraps every such function so that, only while CPU autocast is on, it
runs in float32 with autocast off and gives back what a half-precision kernel would: outputs in
the dtype of its first floating-point input; its backward gets float32 gradients (autograd casts
the returned input gradients back to the inputs' dtypes). With CPU autocast off (GPU or float32
runs) the wrapped functions behave exactly as before.

The Mask R-CNN recipes train in float16 with dynamic loss scaling, as the official XCiT code did
(mmengine's ``AmpOptimWrapper``, which needs an accelerator). ``fit_precision_to_device`` turns
that into float32 on a machine without one, and says so.
"""
import functools
import inspect
import sys
from contextlib import contextmanager
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.device import is_cuda_available, is_mlu_available, is_musa_available, is_npu_available
from mmengine.logging import print_log
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from ..torch_compat import autocast_enabled, cpu_grad_scaler

__all__ = ['CPUAmpOptimWrapper', 'run_mmcv_ops_in_float32', 'fit_precision_to_device']

_MARK = '_deepvit_mm_float32'


def _cast(obj: Any, dtype: Optional[torch.dtype], src: Optional[torch.dtype] = None) -> Any:
    """Floating tensors in ``obj`` (of dtype ``src`` if given) to ``dtype``; containers kept."""
    if dtype is None:
        return obj
    if torch.is_tensor(obj):
        if obj.is_floating_point() and (src is None or obj.dtype == src) and obj.dtype != dtype:
            return obj.to(dtype)
        return obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast(o, dtype, src) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype, src) for k, v in obj.items()}
    return obj


def _first_float_dtype(args) -> Optional[torch.dtype]:
    return next((a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point()), None)


def _wrap_forward(forward: Callable) -> Callable:
    @functools.wraps(forward)
    def wrapped(ctx, *args, **kwargs):
        ctx._deepvit_mm_autocast = autocast_enabled('cpu')
        if not ctx._deepvit_mm_autocast:
            return forward(ctx, *args, **kwargs)
        out_dtype = _first_float_dtype(args)
        with torch.autocast('cpu', enabled=False):
            out = forward(ctx, *_cast(args, torch.float32), **_cast(kwargs, torch.float32))
        # float32 results back to the dtype a half-precision kernel would have returned
        return _cast(out, out_dtype, src=torch.float32)
    return wrapped


def _wrap_backward(backward: Callable) -> Callable:
    @functools.wraps(backward)
    def wrapped(ctx, *grads):
        if getattr(ctx, '_deepvit_mm_autocast', False):
            grads = _cast(grads, torch.float32)
        return backward(ctx, *grads)
    return wrapped


def run_mmcv_ops_in_float32() -> None:
    """Wrap every autograd function of ``mmcv.ops`` as the module docstring says. Idempotent."""
    import mmcv.ops  # noqa: F401  (imports every op module)

    for name, module in list(sys.modules.items()):
        if not (name == 'mmcv.ops' or name.startswith('mmcv.ops.')) or module is None:
            continue
        for fn in list(vars(module).values()):
            if not (inspect.isclass(fn) and issubclass(fn, torch.autograd.Function)
                    and fn.__module__ == name) or fn.__dict__.get(_MARK, False):
                continue
            if isinstance(fn.__dict__.get('forward'), staticmethod):
                fn.forward = staticmethod(_wrap_forward(fn.forward))
            if isinstance(fn.__dict__.get('backward'), staticmethod):
                fn.backward = staticmethod(_wrap_backward(fn.backward))
            setattr(fn, _MARK, True)


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
        # reason: AmpOptimWrapper.__init__ asserts an accelerator; what it sets up is done here
        OptimWrapper.__init__(self, **kwargs)
        self.cast_dtype = getattr(torch, dtype)
        self._scale_update_param = None
        if dtype == 'float16':
            if isinstance(loss_scale, float):
                self._scale_update_param = loss_scale
                self.loss_scaler = cpu_grad_scaler(init_scale=loss_scale)
            elif isinstance(loss_scale, dict):
                self.loss_scaler = cpu_grad_scaler(**loss_scale)
            elif loss_scale == 'dynamic':
                self.loss_scaler = cpu_grad_scaler()
            else:
                raise TypeError(f'loss_scale must be "dynamic", a float or a dict, got '
                                f'{loss_scale!r}')
        else:
            self.loss_scaler = cpu_grad_scaler(enabled=False)
        run_mmcv_ops_in_float32()
        if self.cast_dtype == torch.bfloat16 and not _cpu_has_bfloat16():
            print_log(f'--amp: this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native '
                      'bfloat16 (AVX512-BF16 or AMX): bfloat16 convolutions and matrix products '
                      'are emulated and much slower than float32 here.', logger='current',
                      level=30)

    @contextmanager
    def optim_context(self, model: nn.Module):
        with OptimWrapper.optim_context(self, model), torch.autocast('cpu', dtype=self.cast_dtype):
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


def _cpu_has_bfloat16() -> bool:
    # reason: torch.cpu exposes these checks only under private names (torch 2.x)
    checks = ('_is_avx512_bf16_supported', '_is_amx_tile_supported')
    return any(getattr(torch.cpu, c, lambda: False)() for c in checks)
