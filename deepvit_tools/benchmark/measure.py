"""Latency, throughput and peak memory of one model, input size, dtype and pass (``Case``); the
one interleaving timer every comparison uses (``timings``: ``torch.utils.benchmark``'s clock,
threads and ``Measurement``, one call per timed call, as docs/benchmark.md says why); one more
call under ``torch.profiler`` (``operator_profile``).
"""
import os
import re
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.optim import build_optim_wrapper
from torch.utils.benchmark import Measurement, TaskSpec, set_torch_threads, timer

from deepvit_mm.engine.optimizers.cpu_amp_optim_wrapper import cpu_float16_training_problem

from .baselines import BASELINES
from .batches import backbone_input, synthetic_batch, synthetic_data
from .isolation import IsolatedError, run_isolated
from .memory import peak_memory, tensor_peak
from .models import (
    backbone_info,
    build_backbone,
    build_from_config,
    is_config,
    load_config,
    model_label,
    num_classes_of,
)

__all__ = ['Case', 'parse_size', 'timings', 'measure', 'measure_isolated', 'measure_grid']

PASSES = ('fwd', 'train', 'step')
DTYPES = ('fp32', 'bf16', 'fp16')
AUTOCAST_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}
COMPARE_MODES = tuple((mode, dtype) for mode in PASSES[:2] for dtype in DTYPES)
STEP_OBJECTS = 10  # ground-truth instances per image of a detector's training step


@dataclass
class Case:
    """One measurement.

    Args:
        model (str): A backbone arch (``small_12_p8``, ``s24``, timm names too) or a config file.
        size (tuple[int, int]): Input ``(H, W)``.
        batch (int): Images per call. Default: 1.
        dtype (str): ``fp32``, ``bf16`` or ``fp16`` (autocast). Default: ``fp32``.
        mode (str): ``fwd`` (inference), ``train`` (forward + backward) or, for a config,
            ``step`` (``model.train_step`` on a raw synthetic batch with ``STEP_OBJECTS``
            instances: training preprocessor, forward, backward, the config's optimizer step;
            its precision is the config's, so ``dtype`` stays ``fp32``). Default: ``fwd``.
        device (str): ``cpu`` or ``cuda``. Default: ``cpu``.
        threads (int): Torch threads; 0: torch's default. Default: 0.
        warmup (int): Calls before timing, the memory-measuring first call included. Default: 1.
        repeats (int): Timed calls; 0 measures memory only. Default: 3.
        impl (str): ``ours`` or a baseline of ``baselines.BASELINES`` (archs only). Default:
            ``ours``.
        cfg_options (dict): Config overrides, or for an arch the backbone's arguments. Default: {}.
        tensor_peak (bool): Also count the first call's tensors (``memory.tensor_peak``).
            Default: False.
        mem_limit_gib (float): Address-space cap of ``measure_isolated``'s process; 0: none.
            Default: 0.
        profile (str): A folder: one more call under ``torch.profiler`` after the timed ones
            (``operator_profile``), its Chrome trace written there. Default: ``''`` (none).
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
    profile: str = ''

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
        if self.mode == 'step' and (self.dtype != 'fp32' or not is_config(self.model)):
            raise ValueError("pass 'step' is a config's model.train_step in the config's own "
                             'precision: give a config and dtype fp32')
        if self.batch < 1 or min(self.size) < 1:
            raise ValueError(f'batch {self.batch} and size {self.size} must be positive')


def parse_size(text: str) -> Tuple[int, int]:
    """``'512'`` -> (512, 512); ``'800x1344'`` -> (800, 1344) (height x width)."""
    m = re.fullmatch(r'\s*(\d+)\s*(?:[xX*]\s*(\d+))?\s*', str(text))
    if not m:
        raise ValueError(f'input size {text!r}: give N (square) or HxW, e.g. 512 or 800x1344')
    return int(m.group(1)), int(m.group(2) or m.group(1))


def _scalar(out) -> torch.Tensor:
    if isinstance(out, dict):  # a model's losses
        return sum(_scalar(v) for k, v in out.items() if 'loss' in k)
    if isinstance(out, (list, tuple)):
        return sum(_scalar(v) for v in out)
    return out.float().mean()


def autocast_for(device: str, dtype: str):
    """``torch.autocast`` to bfloat16 (``bf16``) or float16 (``fp16``); nothing for ``fp32``."""
    if dtype == 'fp32':
        return nullcontext()
    kind = torch.device(device).type
    if dtype == 'fp16' and kind == 'cpu' and cpu_float16_training_problem():
        raise ValueError(f'fp16 on CPU: {cpu_float16_training_problem()}')
    return torch.autocast(kind, dtype=AUTOCAST_DTYPES[dtype])


def pass_runner(model: nn.Module, forward: Callable[[], object], mode: str, device: str,
                dtype: str) -> Callable[[], None]:
    """A zero-argument call running one ``mode`` pass of ``forward``: ``fwd`` in eval mode without
    autograd; ``train`` in train mode, backward of a scalar loss, gradients freed."""
    amp = autocast_for(device, dtype)

    def run():
        model.train(mode == 'train')
        if mode == 'fwd':
            with torch.no_grad(), amp:
                forward()
            return
        with amp:
            loss = _scalar(forward())
        loss.backward()
        model.zero_grad(set_to_none=True)
    return run


def timings(runs: Dict[str, Callable[[], object]], warmup: int = 1, repeats: int = 3,
            threads: int = 0, label: str = '', sub_label: str = '') -> Dict[str, Measurement]:
    """``warmup`` untimed calls of each run, then ``repeats`` timed calls of each, interleaved call
    by call with the order rotating so that all see the same machine load; ``threads`` torch
    threads (0: as now). Each run's ``Measurement`` (described by its name, ``metadata``:
    ``cpu_times``, the process's CPU seconds per call)."""
    threads = threads or torch.get_num_threads()
    names = list(runs)
    times: Dict[str, List[float]] = {k: [] for k in names}
    cpu: Dict[str, List[float]] = {k: [] for k in names}
    with set_torch_threads(threads):
        for name in names:
            for _ in range(warmup):
                runs[name]()
        for i in range(repeats):
            for name in names[i % len(names):] + names[:i % len(names)]:
                c0, t0 = time.process_time(), timer()
                runs[name]()
                times[name].append(timer() - t0)
                cpu[name].append(time.process_time() - c0)
    return {k: Measurement(1, times[k], TaskSpec(k, '', label=label, sub_label=sub_label,
                                                 description=k, num_threads=threads),
                           metadata=dict(cpu_times=cpu[k])) for k in names}


def operator_profile(run: Callable[[], object], device: str, trace: str, rows: int = 20) -> str:
    """One call of ``run`` under ``torch.profiler`` (CPU activity, and CUDA's on a GPU): its
    Chrome trace written to ``trace`` (chrome://tracing, Perfetto) and the profiler's table of the
    ``rows`` operators with the most self time (on the GPU: device time)."""
    from torch.profiler import ProfilerActivity, profile
    cuda = str(device).startswith('cuda')
    with profile(activities=[ProfilerActivity.CPU]
                 + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    os.makedirs(os.path.dirname(trace) or '.', exist_ok=True)
    prof.export_chrome_trace(trace)
    averages = prof.key_averages()
    key = 'self_cpu_time_total'
    if cuda:  # torch 2.4 renamed the device columns
        key = 'self_device_time_total' if hasattr(averages[0], 'self_device_time_total') \
            else 'self_cuda_time_total'
    return averages.table(sort_by=key, row_limit=rows)


def _prepare(case: Case) -> Tuple[Callable[[], None], dict]:
    """One pass of ``case``'s model built on its device, and what a report says about it."""
    torch.manual_seed(0)
    if is_config(case.model):
        cfg = load_config(case.model, case.cfg_options)
        model, task = build_from_config(cfg)
        model = model.to(case.device)
        if case.mode == 'step':
            optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
            data = synthetic_data(task, case.size, case.batch, num_classes_of(model, task),
                                  STEP_OBJECTS)
            return lambda: model.train(True).train_step(data, optim_wrapper), dict(task=task)
        inputs, samples = synthetic_batch(model, task, case.size, case.batch)
        mode = 'tensor' if case.mode == 'fwd' else 'loss'
        return pass_runner(model, lambda: model(inputs, samples, mode=mode), case.mode,
                           case.device, case.dtype), dict(task=task)
    model = build_backbone(case.model, **case.cfg_options)
    info = backbone_info(model, case.size)
    if case.impl != 'ours':
        model = BASELINES[case.impl](model, case.size, case.batch)
    model = model.to(case.device)
    x = backbone_input(case.size, case.batch, case.device)
    return pass_runner(model, lambda: model(x), case.mode, case.device, case.dtype), info


def measure(case: Case, memory: bool = True) -> dict:
    """Run ``case`` here: its first call gives the peak memory (when ``memory``; with
    ``warmup=0`` it is also the first timed call), then the other warm-up and timed calls.

    Returns:
        dict: the case's fields, ``info``, ``latencies_ms``, ``measurement`` and the columns of
        ``benchmark.csv`` (docs/benchmark.md); None where not measured.
    """
    out = asdict(case)
    out.update(label=model_label(case.model), peak_mem_mib=None, mem_before_mib=None,
               mem_peak_mib=None, mem_method=None, tensor_peak_mib=None, first_call_ms=None,
               latency_ms=None, latency_iqr_ms=None, latency_min_ms=None, throughput=None,
               cpu_ms=None, latencies_ms=[], measurement=None, profile_table=None,
               profile_trace=None)
    with set_torch_threads(case.threads or torch.get_num_threads()):
        out['threads'] = torch.get_num_threads()
        run, out['info'] = _prepare(case)
        first: Optional[Tuple[float, float]] = None
        if memory:
            def call():
                if case.tensor_peak:
                    out['tensor_peak_mib'] = tensor_peak(run)
                else:
                    run()
            c0, t0 = time.process_time(), timer()
            out['peak_mem_mib'], out['mem_method'], absolute = peak_memory(call, case.device)
            first = timer() - t0, time.process_time() - c0
            out.update(first_call_ms=first[0] * 1e3, mem_before_mib=absolute['before'],
                       mem_peak_mib=absolute['peak'])
        timed_first = first is not None and case.warmup == 0 and case.repeats > 0
        m = timings({out['label']: run}, max(case.warmup - int(memory), 0),
                    case.repeats - int(timed_first), out['threads'], 'benchmark',
                    f'{case.size[0]}x{case.size[1]} {case.dtype} {case.mode}')[out['label']]
        if case.profile:
            name = f"{out['label']}_{case.size[0]}x{case.size[1]}_{case.dtype}_{case.mode}"
            out['profile_trace'] = os.path.join(case.profile, re.sub(r'[^\w.-]', '_', name)
                                                + '.json')
            out['profile_table'] = operator_profile(run, case.device, out['profile_trace'])
    if timed_first:  # no warm-up asked for: the first call is the first timed call
        m = Measurement(1, [first[0]] + m.times, m.task_spec,
                        metadata=dict(cpu_times=[first[1]] + m.metadata['cpu_times']))
    if m.times:
        out.update(latency_ms=m.median * 1e3, latency_iqr_ms=m.iqr * 1e3,
                   latency_min_ms=min(m.times) * 1e3, latencies_ms=[t * 1e3 for t in m.times],
                   throughput=case.batch / m.median, measurement=m,
                   cpu_ms=statistics.median(m.metadata['cpu_times']) * 1e3)
    return out


def measure_isolated(case: Case, timeout: Optional[float] = None) -> dict:
    """``measure(case)`` in a fresh process (``isolation.run_isolated``, its address space capped
    at ``case.mem_limit_gib``); a failure comes back as the case's fields with ``error`` set."""
    try:
        return run_isolated(measure, case, device=case.device, timeout=timeout,
                            mem_limit_gib=case.mem_limit_gib)
    except IsolatedError as e:
        return dict(asdict(case), label=model_label(case.model), error=str(e))


def measure_grid(models: Sequence[str], sizes: Sequence[Tuple[int, int]],
                 dtypes: Sequence[str] = ('fp32',), passes: Sequence[str] = ('fwd',),
                 timeout: Optional[float] = None, log: Callable[[str], None] = print,
                 **case_kwargs) -> List[dict]:
    """``measure_isolated`` for every model x size x dtype x pass (``case_kwargs``: the other
    ``Case`` fields), a line to ``log`` per result."""
    rows = []
    for model in models:
        for size in sizes:
            for dtype in dtypes:
                for mode in passes:
                    r = measure_isolated(Case(model, size, dtype=dtype, mode=mode, **case_kwargs),
                                         timeout=timeout)
                    rows.append(r)
                    log(f'  {r["label"]} {size[0]}x{size[1]} {dtype} {mode}: ' + (
                        f'failed: {r["error"]}' if r.get('error') else
                        f'{r["latency_ms"] or 0:.1f} ms, {r["peak_mem_mib"] or 0:.0f} MiB'))
    return rows
