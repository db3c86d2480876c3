"""The measurement harness behind the measuring tools of ``tools/analysis/``, as mmdet keeps its
own in ``mmdet/utils/benchmark.py`` behind thin ``tools/analysis_tools/``; one idea per module
(docs/layout.md), how each number is taken in docs/benchmark.md.
"""
from .baselines import BASELINES, GemmFloor, TimmBaseline
from .batches import backbone_input, synthetic_batch, synthetic_data
from .compare import compare, compare_grid
from .isolation import IsolatedError, run_isolated
from .measure import (
                      COMPARE_MODES,
                      DTYPES,
                      PASSES,
                      Case,
                      measure,
                      measure_grid,
                      measure_isolated,
                      operator_profile,
                      parse_size,
                      timings,
)
from .memory import current_rss, peak_memory, peak_rss, reset_peak_rss, tensor_peak
from .models import backbone_family, build_backbone, build_from_config, is_config, load_config
from .report import comparison_rows, environment, fmt, markdown_table, size_str, write_report
from .roofline import device_rates, pass_cost, roofline

__all__ = ['BASELINES', 'GemmFloor', 'TimmBaseline', 'backbone_input', 'synthetic_batch',
           'synthetic_data', 'IsolatedError', 'run_isolated', 'COMPARE_MODES', 'DTYPES', 'PASSES',
           'Case', 'compare', 'compare_grid', 'measure',
           'measure_grid', 'measure_isolated', 'operator_profile', 'parse_size', 'timings',
           'current_rss', 'peak_memory', 'peak_rss', 'reset_peak_rss', 'tensor_peak',
           'backbone_family', 'build_backbone', 'build_from_config', 'is_config', 'load_config',
           'comparison_rows', 'environment', 'fmt', 'markdown_table', 'size_str', 'write_report',
           'pass_cost', 'device_rates', 'roofline']
