"""Grids of measurements, each isolated, with a progress line per result: what the tools run."""
from typing import Callable, List, Optional, Sequence, Tuple

from .compare import compare
from .measure import COMPARE_MODES, Case, measure_isolated
from .report import fmt, size_str

__all__ = ['measure_grid', 'compare_grid']


def measure_grid(models: Sequence[str], sizes: Sequence[Tuple[int, int]],
                 dtypes: Sequence[str] = ('fp32',), passes: Sequence[str] = ('fwd',),
                 timeout: Optional[float] = None, log: Callable[[str], None] = print,
                 **case_kwargs) -> List[dict]:
    """``measure_isolated`` for every model x size x dtype x pass, in that order.

    Args:
        models (Sequence[str]): Archs and/or config files.
        sizes (Sequence[tuple[int, int]]): Input sizes.
        dtypes (Sequence[str]): ``fp32`` and/or ``bf16``. Default: ``('fp32',)``.
        passes (Sequence[str]): ``fwd`` and/or ``train``. Default: ``('fwd',)``.
        timeout (float, optional): Seconds per measurement. Default: None.
        log (Callable): Gets one line per result. Default: ``print``.
        **case_kwargs: The other ``Case`` fields (batch, device, threads, warmup, repeats...).

    Returns:
        list[dict]: ``measure``'s results (failures with ``error`` set).
    """
    rows = []
    for model in models:
        for size in sizes:
            for dtype in dtypes:
                for mode in passes:
                    case = Case(model, size, dtype=dtype, mode=mode, **case_kwargs)
                    r = measure_isolated(case, timeout=timeout)
                    rows.append(r)
                    log(f'  {case.label} {size_str(size)} {dtype} {mode}: '
                        + (f'failed: {r["error"]}' if r.get('error') else
                           f'{fmt(r["latency_ms"])} ms, {fmt(r["peak_mem_mib"], 0)} MiB'))
    return rows


def compare_grid(archs: Sequence[str], sizes: Sequence[Tuple[int, int]],
                 dtypes: Sequence[str] = ('fp32', 'bf16'), passes: Sequence[str] = ('fwd', 'train'),
                 baselines: Sequence[str] = ('timm',), log: Callable[[str], None] = print,
                 **compare_kwargs) -> List[dict]:
    """``compare`` for every arch x size, timing the ``COMPARE_MODES`` that ``passes`` and
    ``dtypes`` ask for; ``compare_kwargs`` go to ``compare`` (batch, device, threads, warmup,
    repeats, memory, backbone_kwargs)."""
    modes = [(m, d) for m, d in COMPARE_MODES if m in passes and d in dtypes]
    out = []
    if not modes:
        return out
    for arch in archs:
        for size in sizes:
            c = compare(arch, size, modes=modes, baselines=baselines, **compare_kwargs)
            out.append(c)
            log(f'  {arch} {size_str(size)} ' + ', '.join(
                f'{m}_{d} ' + ', '.join(
                    f'ours/{b} {c[f"{m}_{d}"]["ratio" if b == "timm" else f"ratio_{b}"]:.3f}'
                    for b in baselines) for m, d in modes)
                + (f'; max rel err {c["max_rel_err"]:.1e}' if 'max_rel_err' in c else ''))
    return out
