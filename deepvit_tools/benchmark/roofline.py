"""The one floor: this device's rates measured in the run, and a pass's operators at them.

``device_rates`` times, with ``torch.utils.benchmark.Timer`` on the run's threads, the GEMM
rate per dtype and the streaming bandwidth. ``pass_cost`` counts one call of a pass operator by
operator (``flops.WorkCounter``). ``roofline`` is the sum over operators of
``max(flops / GEMM rate of its dtype, bytes / bandwidth)``: this sequence of operators with each
at the device's limit for its kind. It bounds an implementation that runs them one by one
(eager); fusion moves fewer bytes and can go below it, never below the compute part.
"""
import functools
import statistics
from typing import Callable, Dict, Optional, Sequence

import torch
from torch.utils.benchmark import Timer

from .flops import WorkCounter

__all__ = ['device_rates', 'roofline']


def pass_cost(run: Callable[[], object]) -> Dict[str, object]:
    """One call of ``run`` counted operator by operator: ``ops`` (``flops.Op``: name, flops,
    bytes, dtype), ``flops`` and ``bytes`` (their sums)."""
    with WorkCounter() as counter:
        run()
    return dict(ops=counter.ops, flops=counter.flops, bytes=counter.bytes)


def _seconds(fn: Callable[[], object], repeats: int) -> float:
    timer = Timer('fn()', globals=dict(fn=fn), num_threads=torch.get_num_threads())
    timer.timeit(1)  # warm-up
    return statistics.median(timer.timeit(1).median for _ in range(repeats))


def device_rates(device: str, dtypes: Sequence[torch.dtype] = (torch.float32,),
                 n: Optional[int] = None, repeats: int = 5) -> Dict[object, float]:
    """The device's rates, medians of ``repeats`` timed calls after a warm-up each.

    Args:
        device (str): ``'cpu'`` or a CUDA device.
        dtypes (Sequence[torch.dtype]): The GEMM rates to measure. Default: float32 (under the
            process's TF32 setting).
        n (int, optional): The side of the square GEMM. Default: 8192 on CUDA, 1024 on CPU.
        repeats (int): Timed calls per rate. Default: 5.

    Returns:
        dict: GEMM FLOP/s per dtype; ``'copy'``: bytes/s of ``torch.add(a, b, out=c)`` in
        float32 over tensors of 256 MiB on CUDA, 64 MiB on CPU (two read, one written).
    """
    cuda = str(device).startswith('cuda')
    n = n or (8192 if cuda else 1024)
    rates: Dict[object, float] = {}
    for dtype in dict.fromkeys(dtypes):
        a, b = (torch.full((n, n), 0.5, device=device, dtype=dtype) for _ in range(2))
        rates[dtype] = 2 * n ** 3 / _seconds(functools.partial(torch.mm, a, b), repeats)
    a, b, c = (torch.ones((64 if cuda else 16) * 2 ** 20, device=device) for _ in range(3))
    rates['copy'] = 3 * 4 * a.numel() / _seconds(functools.partial(torch.add, a, b, out=c),
                                                   repeats)
    return rates


def roofline(cost: Dict[str, object], rates: Dict[object, float]) -> Dict[str, float]:
    """``pass_cost``'s operators at ``device_rates``: ``roofline_ms`` (each operator at its
    limit, summed), ``compute_ms`` (all FLOPs at the GEMM rate of their dtype; a dtype without a
    measured rate at the fastest one), ``memory_ms`` (all bytes at the bandwidth), ``gflop``
    and ``gbyte``."""
    fastest = max(v for k, v in rates.items() if isinstance(k, torch.dtype))
    total = compute = 0.0
    for op in cost['ops']:
        c = op.flops / rates.get(op.dtype, fastest) if op.flops else 0.0
        compute += c
        total += max(c, op.bytes / rates['copy'])
    return dict(roofline_ms=total * 1e3, compute_ms=compute * 1e3,
                memory_ms=cost['bytes'] / rates['copy'] * 1e3, gflop=cost['flops'] / 1e9,
                gbyte=cost['bytes'] / 1e9)
