"""Peak memory of one training step: kept for ``from deepvit_mm.memory import ...``.

The measurement lives in the harness, ``deepvit_mm.benchmark`` (``measure_train_step``); run it in
a fresh process (``tools/memory_train_step.py`` does, through ``benchmark.run_isolated``).
"""
from .benchmark.measure import measure_train_step
from .benchmark.memory import MiB, peak_rss

__all__ = ['peak_rss_mib', 'measure_train_step']


def peak_rss_mib() -> float:
    """Peak resident set size of this process since it started, in MiB (``ru_maxrss``)."""
    return peak_rss(since_reset=False) / MiB
