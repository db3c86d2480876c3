"""Export forms of the few layers whose forward would freeze the example input's size.

Inside ``export_forms(model)`` each such layer of ``model`` runs a form that computes the same
values from sizes kept symbolic; outside it nothing is changed (the forwards are set on the
instances for the block only, as the backbones' ``gram_xca`` sets theirs):

* mmseg's ``Upsample`` (Semantic FPN's scale heads) computes its output size as
  ``int(t * scale)``: ``int()`` of a traced size is a constant in the graph. For an integral scale
  the same size is ``t * int(scale)``.
* ``nn.AdaptiveAvgPool2d`` (UperNet's pyramid pooling, bins 1/2/3/6) has no ONNX operator;
  torch's decomposition fixes the bins' bounds at the example's size. Its export form averages
  each bin as a product with (bins x size) averaging matrices built from the traced size, with
  PyTorch's bounds ``[floor(i * n / k), ceil((i + 1) * n / k))``.
"""
import types
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional

import torch
import torch.nn as nn

__all__ = []


def _upsample_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from mmseg.models.utils import resize
    size = [t * int(module.scale_factor) for t in x.shape[-2:]]
    return resize(x, size, None, module.mode, module.align_corners)


def _averaging_matrix(n, bins: int, like: torch.Tensor) -> torch.Tensor:
    """``(bins, n)``: row ``i`` averages PyTorch's adaptive-pooling bin ``i`` of ``n`` inputs."""
    i = torch.arange(bins, device=like.device).unsqueeze(1)
    j = torch.arange(n, device=like.device).unsqueeze(0)
    start = torch.div(i * n, bins, rounding_mode='floor')
    end = torch.div((i + 1) * n + bins - 1, bins, rounding_mode='floor')
    inside = ((j >= start) & (j < end)).to(like.dtype)
    return inside / inside.sum(1, keepdim=True)


def adaptive_avg_pool2d_matmul(x: torch.Tensor, output_size) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, output_size)`` (``(..., H, W)``, int sizes) as two matrix
    products whose shapes follow ``x``'s."""
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    ph = _averaging_matrix(x.shape[-2], oh, x)
    pw = _averaging_matrix(x.shape[-1], ow, x)
    return torch.matmul(torch.matmul(ph, x), pw.t())


def _adaptive_pool_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return adaptive_avg_pool2d_matmul(x, module.output_size)


def _export_form(module: nn.Module) -> Optional[Callable]:
    if type(module) is nn.AdaptiveAvgPool2d:
        size = module.output_size
        sizes = (size, size) if isinstance(size, int) else tuple(size)
        if all(isinstance(s, int) for s in sizes):
            return _adaptive_pool_forward
        return None
    try:
        from mmseg.models.utils import Upsample
    except ImportError:  # mmseg is optional: without it no model holds its Upsample
        return None
    if type(module) is Upsample and not module.size and isinstance(module.scale_factor, float) \
            and module.scale_factor.is_integer():
        return _upsample_forward
    return None


@contextmanager
def export_forms(model: nn.Module) -> Iterator[List[nn.Module]]:
    """Inside the block, the layers of ``model`` listed above run their export forms; yields
    them. Their own forwards are restored after it."""
    patched = []
    for m in model.modules():
        form = _export_form(m)
        if form is not None:
            patched.append((m, m.__dict__.get('forward')))
            m.forward = types.MethodType(form, m)
    try:
        yield [m for m, _ in patched]
    finally:
        for m, previous in patched:
            if previous is None:
                del m.forward
            else:
                m.forward = previous
