"""The measurement harness behind every measuring tool (``tools/analysis/``: ``benchmark.py``,
``memory_train_step.py``, ``benchmark_memory.py``, ``profile_train_step.py``, ``get_flops.py``,
``benchmark_onnx.py``), as mmdet keeps its own in
``mmdet/utils/benchmark.py`` behind thin ``tools/analysis_tools/``.

One idea per module:

* ``isolation``: one fresh process per measurement (``run_isolated``);
* ``memory``: peak memory of one call: resident set with the kernel's high-water mark reset on
  CPU, ``max_memory_allocated`` on CUDA, the profiler's tensor peak on either;
* ``models``: backbones by arch (any family, by ``type`` through the registry) and a config's
  detector or segmentor (mmdet's or mmseg's ``MODELS`` by ``default_scope``);
* ``batches``: a backbone's input, a detection or segmentation batch through the model's own
  data preprocessor;
* ``baselines``: what ours is compared with (timm's ``forward_intermediates``, the GEMM floor);
* ``measure``: ``Case`` -> latency, throughput, memory (here or isolated);
* ``compare``: our backbone against the baselines, interleaved call by call (eager and under
  ``torch.compile``);
* ``roofline``: a pass's FLOPs and bytes operator by operator, against the device's GEMM rate and
  copy bandwidth measured in the same run;
* ``config_runs``: one training step of a config's model; a checkpoint's evaluation
  (``tools/test.py``'s);
* ``breakdown``: a backbone's pass by kind of work, each against its own floor;
* ``step``: a detector's or segmentor's training step timed part by part;
* ``host``: a backbone's training step on a GPU from the host's side (queueing time, waits);
* ``report``: markdown, CSV and plot writers;
* ``suite``: grids of isolated measurements, what the tools run.

How each number is taken is written in ``docs/benchmark.md``.
"""
from .baselines import BASELINES, GemmFloor, TimmBaseline
from .batches import backbone_input, synthetic_batch, synthetic_data
from .breakdown import breakdown_markdown, op_breakdown
from .compare import compare
from .config_runs import evaluate_checkpoint, measure_train_step
from .isolation import IsolatedError, run_isolated
from .measure import COMPARE_MODES, DTYPES, PASSES, Case, measure, measure_isolated, parse_size
from .memory import current_rss, peak_memory, peak_rss, reset_peak_rss, tensor_peak
from .models import backbone_family, build_backbone, build_from_config, is_config, load_config
from .report import (
    environment,
    fmt,
    markdown_table,
    size_str,
    write_report,
)
from .roofline import device_rates, pass_cost, roofline
from .step import profile_train_step, step_markdown
from .suite import compare_grid, measure_grid

__all__ = ['BASELINES', 'GemmFloor', 'TimmBaseline', 'backbone_input', 'synthetic_batch',
           'synthetic_data', 'IsolatedError', 'run_isolated', 'COMPARE_MODES', 'DTYPES', 'PASSES',
           'Case', 'compare', 'evaluate_checkpoint', 'measure',
           'measure_isolated', 'measure_train_step', 'parse_size', 'current_rss', 'peak_memory',
           'peak_rss', 'reset_peak_rss', 'tensor_peak', 'backbone_family', 'build_backbone',
           'build_from_config', 'is_config', 'load_config', 'environment', 'fmt',
           'markdown_table', 'size_str', 'write_report', 'compare_grid', 'measure_grid',
           'profile_train_step', 'step_markdown',
           'op_breakdown', 'breakdown_markdown', 'pass_cost', 'device_rates', 'roofline']
