"""Mixed precision on CPU for mmcv's compiled ops: what ``CPUAmpOptimWrapper`` changes in mmcv
2.1.0 (the only release mmdet 3.3 and mmseg 1.2 accept).

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
runs) the wrapped functions are mmcv's, unchanged.
"""
import functools
import inspect
import sys
from typing import Any, Callable, Optional

import torch

from ...compat.torch import autocast_enabled

__all__ = []

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
