"""How fast a pass could run on this device: its operators at the device's own measured rates.

``pass_cost`` runs one call of a pass under a dispatch mode (below autograd and autocast, so it
sees the backward's operators and autocast's casts) and records, per aten operator, the floating
point operations (``torch.utils.flop_counter.FlopCounterMode``'s formulas: matrix products,
convolutions, attention) and the bytes it must read and write (its tensor inputs and outputs at
their dtypes' sizes; views and allocations move none).

``device_rates`` times, in the same process, the device's GEMM rate in a dtype (a square
``torch.mm`` of side ``n``) and its copy bandwidth (``clone`` of a large tensor, bytes read and
written).

The roofline of the pass is then ``sum over operators of max(flops / GEMM rate in the operator's
dtype, bytes / copy bandwidth)``: the time of this sequence of operators if each ran at the
device's limit for its kind. It bounds any implementation that runs these operators one by one
(eager PyTorch); a compiler that fuses operators moves fewer bytes and can go below it, never
below ``flops / GEMM rate`` (the ``compute_ms`` part).
"""
import functools
import statistics
from typing import Callable, Dict, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .measure import time_calls

__all__ = ['pass_cost', 'device_rates', 'roofline']

_NO_TRAFFIC = frozenset(('empty', 'empty_like', 'empty_strided', 'detach', 'lift_fresh',
                         'lift_fresh_copy', 'alias', 'set_', 'resize_', '_local_scalar_dense'))


def _tensor_bytes(t: torch.Tensor) -> int:
    # an expanded or strided view reads no more than its storage
    logical = t.numel() * t.element_size()
    try:
        return min(logical, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, functional)
        return logical


def _is_view(func) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)


class _CostMode(TorchDispatchMode):
    """Per operator: FLOPs (the delta of an inner ``FlopCounterMode``), bytes read and written,
    and the dtype whose GEMM rate applies."""

    def __init__(self, flops):
        super().__init__()
        self.flops = flops
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.flops.get_total_flops()
        out = func(*args, **kwargs)
        name = func._schema.name.split('::')[-1]
        if _is_view(func) or name in _NO_TRAFFIC:
            return out
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        floats = [a.dtype for a in ins if a.dtype.is_floating_point]
        self.ops.append((name, self.flops.get_total_flops() - before,
                         sum(map(_tensor_bytes, ins)) + sum(map(_tensor_bytes, outs)),
                         floats[0] if floats else None))
        return out


def pass_cost(run: Callable[[], object]) -> Dict[str, object]:
    """One call of ``run`` counted operator by operator.

    Returns:
        dict: ``ops`` (a list of ``(name, flops, bytes, dtype)``), ``flops`` and ``bytes`` (their
        sums).
    """
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as flops, _CostMode(flops) as cost:
        run()
    return dict(ops=cost.ops, flops=sum(o[1] for o in cost.ops),
                bytes=sum(o[2] for o in cost.ops))


def device_rates(device: str, dtypes=(torch.float32,), n: Optional[int] = None,
                 repeats: int = 5) -> Dict[object, float]:
    """The device's measured rates, medians of ``repeats`` timed calls after one warm-up: GEMM
    FLOP/s per dtype (``torch.mm`` of two ``n x n`` matrices; default n: 8192 on CUDA, 1024 on
    CPU; float32 under the process's TF32 setting) and ``'copy'``: bytes/s of ``clone`` (read and
    written) of a 256 MiB (CUDA) or 64 MiB (CPU) tensor."""
    cuda = str(device).startswith('cuda')
    n = n or (8192 if cuda else 1024)
    rates: Dict[object, float] = {}
    for dtype in dict.fromkeys(dtypes):
        a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
        mm = functools.partial(torch.mm, a, b)
        time_calls(mm, device, 1)
        rates[dtype] = 2 * n ** 3 / statistics.median(time_calls(mm, device, repeats))
        del a, b, mm
    x = torch.empty((256 if cuda else 64) * 2 ** 18, device=device)  # float32: 4 bytes each
    time_calls(x.clone, device, 1)
    rates['copy'] = 2 * x.numel() * 4 / statistics.median(time_calls(x.clone, device, repeats))
    return rates


def roofline(cost: Dict[str, object], rates: Dict[object, float]) -> Dict[str, float]:
    """``pass_cost``'s operators at ``device_rates``: ``roofline_ms`` (each operator at its
    limit, summed), ``compute_ms`` (all FLOPs at the GEMM rate of their dtype), ``memory_ms``
    (all bytes at the copy bandwidth), ``gflop`` and ``gbyte``. An operator's FLOPs in a dtype
    without a measured rate count at the fastest rate measured (a lower bound)."""
    fastest = max(v for k, v in rates.items() if k != 'copy')
    bw = rates['copy']
    total = compute = 0.0
    for _, flops, nbytes, dtype in cost['ops']:
        c = flops / rates.get(dtype, fastest) if flops else 0.0
        compute += c
        total += max(c, nbytes / bw)
    return dict(roofline_ms=total * 1e3, compute_ms=compute * 1e3,
                memory_ms=cost['bytes'] / bw * 1e3, gflop=cost['flops'] / 1e9,
                gbyte=cost['bytes'] / 1e9)
