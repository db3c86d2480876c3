"""Latency, throughput and peak memory of one model, input size, dtype and pass.

Per ``Case`` (model, input size, dtype, pass) ``measure`` reports:

* **latency**: the median wall-clock time of ``repeats`` calls after ``warmup`` calls (on CUDA
  with ``torch.cuda.synchronize()`` around each call); the first call, which measures memory,
  counts as the first warm-up call, or as the first timed call when ``warmup`` is 0;
* **throughput**: batch size / median latency, in images per second;
* **peak memory** of the first call beyond what the built model and its input hold
  (``memory.peak_memory``); ``measure_isolated`` runs it in a fresh process, so nothing measured
  before lingers.

Passes: ``fwd`` is an eval-mode forward without autograd (inference); ``train`` a train-mode
forward and backward of a scalar loss (for a backbone the sum of its outputs' means, for a
config's model its losses on a synthetic batch), gradients freed between calls, no optimizer
step. Dtypes: ``fp32``; ``bf16`` (``fp16``) wraps the forward in ``torch.autocast(device,
torch.bfloat16)`` (``torch.float16``), the backward runs outside it; the timed backward of ``fp16``
is unscaled (a loss scale multiplies one tensor: no time).

Comparisons against baselines are in ``compare``; whole runs of a config (a training step, an
evaluation) in ``config_runs``.
"""
import re
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from deepvit_mm.engine.optimizers.cpu_amp_optim_wrapper import cpu_float16_training_problem

from .baselines import BASELINES
from .batches import backbone_input, synthetic_batch
from .isolation import IsolatedError, run_isolated
from .memory import peak_memory, synchronize, tensor_peak
from .models import (
    backbone_info,
    build_backbone,
    build_from_config,
    is_config,
    model_label,
)

__all__ = ['PASSES', 'DTYPES', 'COMPARE_MODES', 'Case', 'parse_size', 'autocast_for', 'pass_runner',
           'time_calls', 'torch_threads', 'measure', 'measure_isolated']

PASSES = ('fwd', 'train')
DTYPES = ('fp32', 'bf16', 'fp16')
AUTOCAST_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}
COMPARE_MODES = tuple((mode, dtype) for mode in PASSES for dtype in DTYPES)


# --------------------------------------------------------------------------------------------
# what to measure
# --------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One measurement.

    Args:
        model (str): A backbone arch (XCiT ``small_12_p8``, CaiT ``s24``, timm names too) or a
            config file path.
        size (tuple[int, int]): Input ``(H, W)``.
        batch (int): Images per call. Default: 1.
        dtype (str): ``fp32``, ``bf16`` or ``fp16``. Default: ``fp32``.
        mode (str): ``fwd`` (inference) or ``train`` (forward + backward). Default: ``fwd``.
        device (str): ``cpu`` or ``cuda``. Default: ``cpu``.
        threads (int): ``torch.set_num_threads``; 0 leaves torch's default. Default: 0.
        warmup (int): Calls before timing, the memory-measuring first call included. Default: 1.
        repeats (int): Timed calls; 0 measures memory only. Default: 3.
        impl (str): ``ours`` (our backbone or the config's model) or a baseline of
            ``baselines.BASELINES`` built from our backbone (``timm``, ``floor``; archs only).
            Default: ``ours``.
        cfg_options (dict): Config overrides for a config model; for an arch, the backbone's
            keyword arguments (e.g. ``gram_xca=True``, ``window_size=14``). Default: {}.
        tensor_peak (bool): Also count the first call's tensor memory with ``torch.profiler``
            (``memory.tensor_peak``; the call then runs under the profiler). Default: False.
        mem_limit_gib (float): Address-space cap of the measuring process (``measure_isolated``
            only); 0: none. Default: 0.
    """
    model: str
    size: Tuple[int, int]
    batch: int = 1
    dtype: str = 'fp32'
    mode: str = 'fwd'
    device: str = 'cpu'
    threads: int = 0
    warmup: int = 1
    repeats: int = 3
    impl: str = 'ours'
    cfg_options: dict = field(default_factory=dict)
    tensor_peak: bool = False
    mem_limit_gib: float = 0.0

    def __post_init__(self):
        self.size = tuple(self.size)
        if self.dtype not in DTYPES:
            raise ValueError(f'dtype {self.dtype!r}: use one of {", ".join(DTYPES)}')
        if self.mode not in PASSES:
            raise ValueError(f'pass {self.mode!r}: use one of {", ".join(PASSES)}')
        if self.impl != 'ours' and self.impl not in BASELINES:
            raise ValueError(f"impl {self.impl!r}: use 'ours' or one of {', '.join(BASELINES)}")
        if self.impl != 'ours' and is_config(self.model):
            raise ValueError(f'the {self.impl} baseline exists for backbone archs, not for config '
                             'models')
        if self.batch < 1 or min(self.size) < 1:
            raise ValueError(f'batch {self.batch} and size {self.size} must be positive')

    @property
    def label(self) -> str:
        """The model's name in reports."""
        return model_label(self.model)


def parse_size(text: str) -> Tuple[int, int]:
    """``'512'`` -> (512, 512); ``'800x1344'`` -> (800, 1344) (height x width)."""
    m = re.fullmatch(r'\s*(\d+)\s*(?:[xX*]\s*(\d+))?\s*', str(text))
    if not m:
        raise ValueError(f'input size {text!r}: give N (square) or HxW, e.g. 512 or 800x1344')
    h = int(m.group(1))
    return h, int(m.group(2) or h)


# --------------------------------------------------------------------------------------------
# one call of a pass
# --------------------------------------------------------------------------------------------
def _scalar(out) -> torch.Tensor:
    if isinstance(out, dict):  # a model's losses
        return sum(_scalar(v) for k, v in out.items() if 'loss' in k)
    if isinstance(out, (list, tuple)):
        return sum(_scalar(v) for v in out)
    return out.float().mean()


def autocast_for(device: str, dtype: str):
    """``torch.autocast`` on ``device`` to bfloat16 for ``dtype='bf16'``, to float16 for
    ``'fp16'``; no context for ``'fp32'``."""
    if dtype == 'fp32':
        return nullcontext()
    kind = torch.device(device).type
    if dtype == 'fp16' and kind == 'cpu' and cpu_float16_training_problem():
        raise ValueError(f'fp16 on CPU: {cpu_float16_training_problem()}')
    return torch.autocast(kind, dtype=AUTOCAST_DTYPES[dtype])


def pass_runner(model: nn.Module, forward: Callable[[], object], mode: str, device: str,
                dtype: str) -> Callable[[], None]:
    """A zero-argument call running one ``mode`` pass (``fwd`` or ``train``) of ``forward``."""
    amp = autocast_for(device, dtype)
    if mode == 'fwd':
        def run():
            model.eval()
            with torch.no_grad(), amp:
                forward()
    else:
        def run():
            model.train()
            with amp:
                loss = _scalar(forward())
            loss.backward()
            model.zero_grad(set_to_none=True)
    return run


def _prepare(case: Case) -> Tuple[Callable[[], None], dict]:
    """A zero-argument call running one pass of ``case``'s model (built on its device), and
    what a report says about the model (``models.backbone_info`` for a backbone)."""
    torch.manual_seed(0)
    device = torch.device(case.device)
    if is_config(case.model):
        model, task = build_from_config(case.model, case.cfg_options)
        model = model.to(device)
        inputs, samples = synthetic_batch(model, task, case.size, case.batch)
        mode = 'tensor' if case.mode == 'fwd' else 'loss'
        return pass_runner(model, lambda: model(inputs, samples, mode=mode), case.mode,
                           case.device, case.dtype), dict(task=task)
    model = build_backbone(case.model, **case.cfg_options)
    info = backbone_info(model, case.size)
    if case.impl != 'ours':
        model = BASELINES[case.impl](model, case.size, case.batch)
    model = model.to(device)
    x = backbone_input(case.size, case.batch, case.device)
    return pass_runner(model, lambda: model(x), case.mode, case.device, case.dtype), info


def time_calls(run: Callable[[], None], device: str, n: int,
                cpu_times: Optional[List[float]] = None) -> List[float]:
    """Wall-clock seconds of ``n`` calls; the process's CPU seconds go to ``cpu_times``."""
    times = []
    for _ in range(n):
        synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        synchronize(device)
        times.append(time.perf_counter() - t0)
        if cpu_times is not None:
            cpu_times.append(time.process_time() - c0)
    return times


def interleaved(runs: Dict[str, Callable[[], None]], device: str, warmup: int,
                repeats: int) -> Dict[str, List[float]]:
    """``warmup`` untimed calls of each run, then ``repeats`` timed calls of each, interleaved
    call by call with the order rotating, so that all see the same machine load: seconds per
    call, by name."""
    for run in runs.values():
        time_calls(run, device, warmup)
    names = list(runs)
    times: Dict[str, List[float]] = {k: [] for k in names}
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name] += time_calls(runs[name], device, 1)
    return times


@contextmanager
def torch_threads(n: int):
    """``torch.set_num_threads(n)`` inside the block (n > 0), restored after it."""
    saved = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


# --------------------------------------------------------------------------------------------
# one measurement, here or in a fresh process
# --------------------------------------------------------------------------------------------
def measure(case: Case, memory: bool = True) -> dict:
    """Run ``case`` in this process: its first call gives the peak memory (when ``memory``), then
    the remaining warm-up calls and the timed calls.

    Returns:
        dict: the case's fields plus ``label``, ``latency_ms`` (median), ``latency_min_ms``,
        ``throughput`` (images/s), ``cpu_ms`` (median CPU time of the process per call, all
        threads summed: on a loaded machine with ``threads=1`` it estimates the idle latency),
        ``peak_mem_mib`` (growth over the model and input), ``mem_before_mib`` and
        ``mem_peak_mib`` (the absolute readings), ``mem_method``, ``latencies_ms`` (every timed
        call), ``info`` (``models.backbone_info`` for a backbone, the task for a config),
        ``tensor_peak_mib`` (with ``case.tensor_peak``) and ``first_call_ms`` (the cold first
        call, which pays one-time costs). Values not measured are None.
    """
    out = asdict(case)
    out.update(label=case.label, peak_mem_mib=None, mem_before_mib=None, mem_peak_mib=None,
               mem_method=None, tensor_peak_mib=None, first_call_ms=None, latency_ms=None,
               latency_min_ms=None, throughput=None, cpu_ms=None, latencies_ms=[])
    with torch_threads(case.threads):
        out['threads'] = torch.get_num_threads()
        run, out['info'] = _prepare(case)
        times: List[float] = []
        cpu: List[float] = []
        if memory:
            call = run
            if case.tensor_peak:
                def call():
                    out['tensor_peak_mib'] = tensor_peak(run)
            c0, t0 = time.process_time(), time.perf_counter()
            out['peak_mem_mib'], out['mem_method'], absolute = peak_memory(call, case.device)
            first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
            out.update(first_call_ms=first * 1e3, mem_before_mib=absolute['before'],
                       mem_peak_mib=absolute['peak'])
            if case.warmup == 0 and case.repeats > 0:  # no warm-up asked for: the first is timed
                times.append(first)
                cpu.append(first_cpu)
        time_calls(run, case.device, max(case.warmup - int(memory), 0))
        times += time_calls(run, case.device, case.repeats - len(times), cpu)
    if times:
        med = statistics.median(times)
        out.update(latency_ms=med * 1e3, latency_min_ms=min(times) * 1e3,
                   latencies_ms=[t * 1e3 for t in times],
                   throughput=case.batch / med, cpu_ms=statistics.median(cpu) * 1e3)
    return out


def measure_isolated(case: Case, timeout: Optional[float] = None) -> dict:
    """``measure(case)`` in a fresh process (``isolation.run_isolated``; with
    ``case.mem_limit_gib`` its address space is capped). A failure there (an exception, a crash,
    a time-out) comes back as the case's fields with ``error`` set to a message."""
    try:
        return run_isolated(measure, case, device=case.device, timeout=timeout,
                            mem_limit_gib=case.mem_limit_gib)
    except IsolatedError as e:
        out = asdict(case)
        out.update(label=case.label, error=str(e))
        return out
