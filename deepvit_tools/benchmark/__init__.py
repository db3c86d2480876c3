"""The measurement harness behind the measuring tools of ``tools/analysis/``, as mmdet keeps its
own in ``mmdet/utils/benchmark.py`` behind thin ``tools/analysis_tools/``; one idea per module
(docs/layout.md), how each number is taken in docs/benchmark.md.
"""
from .baselines import BASELINES
from .compare import compare, compare_grid
from .measure import Case, measure, measure_grid, measure_isolated, parse_size, timings
from .memory import tensor_peak
from .models import build_from_config, load_config
from .report import environment, fmt, markdown_table, size_str, write_report
from .roofline import device_rates, roofline

__all__ = ['BASELINES', 'Case', 'compare', 'compare_grid', 'measure', 'measure_grid',
           'measure_isolated', 'parse_size', 'timings', 'tensor_peak', 'build_from_config',
           'load_config', 'environment', 'fmt', 'markdown_table', 'size_str', 'write_report',
           'device_rates', 'roofline']
