"""The one floor: this device's rates measured in the run, and a pass's operators at them.

``device_rates`` times, with ``torch.utils.benchmark.Timer`` on the run's threads, the GEMM
rate per dtype, the streaming bandwidth and the exact-GELU rate; the roofline, the breakdown and
the training-step floors all take their rates from it. ``pass_cost`` counts one call of a pass
operator by operator (``flops.WorkCounter``). ``roofline`` is the sum over operators of
``max(flops / GEMM rate of its dtype, bytes / bandwidth)``: this sequence of operators with each
at the device's limit for its kind. It bounds an implementation that runs them one by one
(eager); fusion moves fewer bytes and can go below it, never below the compute part.
"""
import functools
import statistics
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch.utils.benchmark import Timer

from .flops import WorkCounter

__all__ = ['pass_cost', 'device_rates', 'roofline']


def pass_cost(run: Callable[[], object]) -> Dict[str, object]:
    """One call of ``run`` counted operator by operator: ``ops`` (``flops.Op``: name, flops,
    bytes, dtype, elements), ``flops`` and ``bytes`` (their sums)."""
    with WorkCounter() as counter:
        run()
    return dict(ops=counter.ops, flops=counter.flops, bytes=counter.bytes)


def _seconds(fn: Callable[[], object], repeats: int) -> float:
    timer = Timer('fn()', globals=dict(fn=fn), num_threads=torch.get_num_threads())
    timer.timeit(1)  # warm-up
    return statistics.median(timer.timeit(1).median for _ in range(repeats))


def device_rates(device: str, dtypes: Sequence[torch.dtype] = (torch.float32,),
                 n: Optional[int] = None, repeats: int = 5,
                 gemm: Optional[Tuple[int, int, int]] = None,
                 stream: Optional[int] = None, gelu: bool = False,
                 mlp: Optional[Tuple[int, int]] = None) -> Dict[object, float]:
    """The device's rates, medians of ``repeats`` timed calls after a warm-up each.

    Args:
        device (str): ``'cpu'`` or a CUDA device.
        dtypes (Sequence[torch.dtype]): The GEMM rates to measure. Default: float32 (under the
            process's TF32 setting).
        n (int, optional): The side of the square GEMM. Default: 8192 on CUDA, 1024 on CPU.
        repeats (int): Timed calls per rate. Default: 5.
        gemm (tuple[int, int, int], optional): ``(m, k, n)``: a ``(m, k) x (k, n)`` GEMM (a
            model's own shape) instead of the square one.
        stream (int, optional): Elements of each streamed tensor. Default: 64 Mi on CUDA (256
            MiB in float32), 16 Mi on CPU.
        gelu (bool): Also time exact GELU (the breakdown's floor). Default: False.
        mlp (tuple[int, int], optional): ``(tokens, C)``: the rates at a transformer MLP's
            shape, the ``(tokens, C) x (C, 4C)`` GEMM and a stream over the ``tokens x 4C``
            hidden map (the breakdown's and the training step's floors); sets ``gemm`` and
            ``stream``.

    Returns:
        dict: GEMM FLOP/s per dtype; ``'copy'``: bytes/s of ``torch.add(a, b, out=c)`` in
        float32 (two tensors read, one written); with ``gelu``, ``'gelu'``: elements/s of exact
        ``F.gelu`` on ``a``.
    """
    cuda = str(device).startswith('cuda')
    if mlp is not None:
        tokens, c = mlp
        gemm, stream = (tokens, c, 4 * c), tokens * 4 * c
    m, k, n = gemm or (n or (8192 if cuda else 1024),) * 3
    rates: Dict[object, float] = {}
    for dtype in dict.fromkeys(dtypes):
        a = torch.full((m, k), 0.5, device=device, dtype=dtype)
        b = torch.full((k, n), 0.5, device=device, dtype=dtype)
        rates[dtype] = 2 * m * k * n / _seconds(functools.partial(torch.mm, a, b), repeats)
    a, b, c = (torch.ones(stream or (64 if cuda else 16) * 2 ** 20, device=device)
               for _ in range(3))
    rates['copy'] = 3 * 4 * a.numel() / _seconds(functools.partial(torch.add, a, b, out=c),
                                                   repeats)
    if gelu:
        rates['gelu'] = a.numel() / _seconds(functools.partial(torch.nn.functional.gelu, a),
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
