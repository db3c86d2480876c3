"""Latency, throughput and peak memory of one model, input size, dtype and pass; comparisons.

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
step. Dtypes: ``fp32``; ``bf16`` wraps the forward in ``torch.autocast(device, torch.bfloat16)``,
the backward runs outside it.

``compare`` times our backbone against baselines (``baselines.BASELINES``: timm's
``forward_intermediates`` + the same adapter; the GEMM floor) in one process, interleaved call by
call, and checks that outputs meant to be equal are. ``measure_train_step`` is one optimizer step
of a config's model (the Runner's ``train_step``); ``evaluate_checkpoint`` is ``tools/test.py``'s
evaluation.
"""
import numbers
import os
import re
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

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

__all__ = ['PASSES', 'DTYPES', 'COMPARE_MODES', 'Case', 'parse_size', 'measure',
           'measure_isolated', 'compare', 'compare_with_timm', 'measure_train_step',
           'evaluate_checkpoint']

PASSES = ('fwd', 'train')
DTYPES = ('fp32', 'bf16')
COMPARE_MODES = (('fwd', 'fp32'), ('fwd', 'bf16'), ('train', 'fp32'), ('train', 'bf16'))


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
        dtype (str): ``fp32`` or ``bf16``. Default: ``fp32``.
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


def _amp(device: str, dtype: str):
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if dtype == 'bf16' \
        else nullcontext()


def pass_runner(model: nn.Module, forward: Callable[[], object], mode: str, device: str,
                dtype: str) -> Callable[[], None]:
    """A zero-argument call running one ``mode`` pass (``fwd`` or ``train``) of ``forward``."""
    amp = _amp(device, dtype)
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


def _sync(device: str) -> None:
    if str(device).startswith('cuda'):
        torch.cuda.synchronize()


def _time_calls(run: Callable[[], None], device: str, n: int,
                cpu_times: Optional[List[float]] = None) -> List[float]:
    """Wall-clock seconds of ``n`` calls; the process's CPU seconds go to ``cpu_times``."""
    times = []
    for _ in range(n):
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if cpu_times is not None:
            cpu_times.append(time.process_time() - c0)
    return times


@contextmanager
def _threads(n: int):
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
    with _threads(case.threads):
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
        _time_calls(run, case.device, max(case.warmup - int(memory), 0))
        times += _time_calls(run, case.device, case.repeats - len(times), cpu)
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


# --------------------------------------------------------------------------------------------
# our backbone against baselines, interleaved
# --------------------------------------------------------------------------------------------
def _max_rel_err(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """max over levels of ``max|a - b| / max|b|`` (relative to each level's scale)."""
    return max(float((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-12))
               for x, y in zip(a, b))


@contextmanager
def _no_tf32():
    """Full float32 precision for CUDA convs and matmuls inside the block."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _err_key(name: str, dtype: str) -> str:
    prefix = '' if name == 'timm' else f'{name}_'  # 'max_rel_err' stays timm's (older reports)
    return f'{prefix}{"bf16_" if dtype == "bf16" else ""}max_rel_err'


def compare(arch: str, size: Tuple[int, int], batch: int = 1, device: str = 'cpu',
            threads: int = 0, warmup: int = 1, repeats: int = 3, memory: bool = True,
            modes: Sequence[Tuple[str, str]] = COMPARE_MODES,
            backbone_kwargs: Optional[dict] = None,
            baselines: Sequence[str] = ('timm',)) -> dict:
    """Our backbone against ``baselines`` (names of ``baselines.BASELINES``) built from it.

    All get the same input; timing interleaves them call by call (rotating which goes first) so
    that all see the same machine load. Memory (when ``memory``) is measured per implementation
    in fresh processes (``measure_isolated``) on CPU, and in this process on CUDA
    (``max_memory_allocated`` is exact per pass).

    Args:
        arch (str): A backbone arch (XCiT or CaiT).
        size (tuple[int, int]): Input ``(H, W)``.
        batch (int): Images per call. Default: 1.
        device (str): ``cpu`` or ``cuda``. Default: ``cpu``.
        threads (int): Torch threads while comparing (restored after); 0: torch's. Default: 0.
        warmup (int): Untimed calls of each implementation per mode. Default: 1.
        repeats (int): Timed calls of each implementation per mode. Default: 3.
        memory (bool): Also measure each one's peak memory. Default: True.
        modes (Sequence[tuple[str, str]]): ``(pass, dtype)`` pairs timed. Default: all four.
        backbone_kwargs (dict, optional): The backbone's arguments (e.g. ``gram_xca=True``).
        baselines (Sequence[str]): What ours is compared with. Default: ``('timm',)``.

    Returns:
        dict: the settings; ``max_rel_err`` (fp32 eval outputs, ours vs timm, see
        ``_max_rel_err``) and ``bf16_max_rel_err`` (when a bf16 mode is timed), for each baseline
        whose outputs must equal ours; and for each mode, keyed ``{pass}_{dtype}``: ``ours_ms``
        and ``{name}_ms`` (medians), ``ratio`` (ours / timm) and ``ratio_{name}`` (ours / any
        other baseline), ``{impl}_mem_mib`` when ``memory`` (ours and the baselines whose
        outputs equal ours).
    """
    backbone_kwargs = dict(backbone_kwargs or {})
    device = str(device)
    with _threads(threads):
        torch.manual_seed(0)
        ours = build_backbone(arch, **backbone_kwargs)
        for m in ours.modules():  # non-trivial BN statistics, so that the check covers them
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.8, 1.2)
        models = {'ours': ours}
        for name in baselines:  # built from ours before it moves: copies its trunk weights
            models[name] = BASELINES[name](ours, size, batch)
        models = {k: m.to(device) for k, m in models.items()}
        x = backbone_input(size, batch, device)
        out = dict(model=arch, label=arch, size=tuple(size), batch=batch, device=device,
                   threads=torch.get_num_threads(), warmup=warmup, repeats=repeats,
                   fast_path=ours.fast_path, baselines=list(baselines))
        checked = [n for n in baselines if models[n].checks_output]
        for m in models.values():
            m.eval()
        # the check is of the math: TF32 convs/matmuls (cuDNN's default on recent GPUs) would turn
        # float32 rounding differences into ~1e-4 TF32 rounding flips in the adapter's convs
        with torch.no_grad(), _no_tf32():
            for dtype in ('fp32', 'bf16'):
                if dtype == 'bf16' and not any(d == 'bf16' for _, d in modes):
                    continue
                with _amp(device, dtype):
                    ref = ours(x)
                    for name in checked:
                        out[_err_key(name, dtype)] = _max_rel_err(ref, models[name](x))

        for mode, dtype in modes:
            runs = {k: pass_runner(m, (lambda m=m: m(x)), mode, device, dtype)
                    for k, m in models.items()}
            for r in runs.values():
                _time_calls(r, device, warmup)
            names = list(runs)
            times: Dict[str, List[float]] = {k: [] for k in names}
            for i in range(repeats):
                for name in names[i % len(names):] + names[:i % len(names)]:
                    times[name] += _time_calls(runs[name], device, 1)
            res = {f'{k}_ms': statistics.median(v) * 1e3 for k, v in times.items()}
            for name in baselines:
                res['ratio' if name == 'timm' else f'ratio_{name}'] = \
                    res['ours_ms'] / res[f'{name}_ms']
            # memory of what computes the same as ours (the floor's is not a model's)
            mem_of = ['ours'] + checked if memory else []
            if device.startswith('cuda'):
                for k in mem_of:
                    res[f'{k}_mem_mib'] = peak_memory(runs[k], device)[0]
            else:
                for k in mem_of:
                    m = measure_isolated(Case(arch, size, batch, dtype, mode, device, threads,
                                              warmup=0, repeats=0, impl=k,
                                              cfg_options=backbone_kwargs))
                    res[f'{k}_mem_mib'] = m.get('peak_mem_mib')
            out[f'{mode}_{dtype}'] = res
    return out


def compare_with_timm(arch: str, size: Tuple[int, int], batch: int = 1, device: str = 'cpu',
                      threads: int = 0, warmup: int = 1, repeats: int = 3, memory: bool = True,
                      modes: Sequence[Tuple[str, str]] = COMPARE_MODES,
                      backbone_kwargs: Optional[dict] = None) -> dict:
    """``compare`` against timm's ``forward_intermediates`` + the same adapter only (see there)."""
    return compare(arch, size, batch, device, threads, warmup, repeats, memory, modes,
                   backbone_kwargs, baselines=('timm',))


# --------------------------------------------------------------------------------------------
# one training step of a config's model
# --------------------------------------------------------------------------------------------
def measure_train_step(config: str, *, with_cp: Optional[bool] = None, batch_size: int = 1,
                       height: int = 800, width: int = 1344, num_objects: int = 10,
                       cfg_options: Optional[dict] = None, seed: int = 0,
                       device: str = 'cpu') -> Dict[str, float]:
    """Peak memory and time of one training step (``model.train_step``: data preprocessor,
    forward, backward, optimizer step with its state) of ``config`` on a synthetic batch.

    The model and its optimizer wrapper are built as mmengine's Runner builds them (no weights
    file, SyncBN reverted to BN as in any single-process run). Run it in a fresh process
    (``run_isolated``): on a system without ``/proc`` the peak is the process's since it started.
    Note that a segmentor's training preprocessor pads a batch smaller than its crop size up to it.

    Args:
        config (str): An mmdet or mmseg config with a deepvit_mm backbone.
        with_cp (bool, optional): Override ``model.backbone.with_cp``. Default: the config's.
        batch_size (int): Images in the batch. Default: 1.
        height (int): Image height. Default: 800.
        width (int): Image width. Default: 1344.
        num_objects (int): Ground-truth instances per image (detectors). Default: 10.
        cfg_options (dict, optional): More config overrides.
        seed (int): Seed of the weights, the batch and the RoI sampling (the same loss with and
            without checkpointing). Default: 0.
        device (str): ``cpu`` or ``cuda``. Default: ``cpu``.

    Returns:
        dict: ``peak_rss_mib`` (the whole process's peak during the step: resident set on CPU,
        allocated tensor memory on CUDA), ``before_step_mib`` (model, optimizer and batch built),
        ``step_peak_mib`` (their difference: what the step itself needs), ``mem_method``,
        ``step_seconds``, ``loss`` and the settings measured.
    """
    from mmengine.optim import build_optim_wrapper
    cfg = load_config(config, cfg_options)
    if with_cp is not None:
        cfg.model.backbone.with_cp = with_cp
    torch.manual_seed(seed)
    model, task = build_from_config(cfg)
    model = model.to(device).train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    data = synthetic_data(task, (height, width), batch_size, num_classes_of(model, task),
                          num_objects, seed)
    torch.manual_seed(seed)
    log_vars = {}
    t0 = time.perf_counter()
    step, method, absolute = peak_memory(lambda: log_vars.update(model.train_step(data,
                                                                                  optim_wrapper)),
                                         device)
    seconds = time.perf_counter() - t0
    return dict(with_cp=bool(cfg.model.backbone.get('with_cp', False)), batch_size=batch_size,
                height=height, width=width, device=device, peak_rss_mib=round(absolute['peak'], 1),
                before_step_mib=round(absolute['before'], 1), step_peak_mib=round(step, 1),
                mem_method=method, step_seconds=round(seconds, 1),
                loss=float(torch.as_tensor(log_vars['loss']).detach()),
                threads=torch.get_num_threads())


# --------------------------------------------------------------------------------------------
# accuracy of a checkpoint: tools/test.py's evaluation
# --------------------------------------------------------------------------------------------
def _test(config: str, checkpoint: str, work_dir: str, cfg_options: Optional[dict]) -> dict:
    # the body of tools/test.py's main() without its display options: the same calls in order
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from ..runtime import keep_freed_cpu_memory, prepare_config, setup_cpu_distributed
    if not torch.cuda.is_available():
        keep_freed_cpu_memory()  # process-wide, as tools/test.py: this process only
    cfg = prepare_config(config, work_dir=work_dir, cfg_options=cfg_options, load_from=checkpoint)
    setup_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    return {k: float(v) for k, v in runner.test().items() if isinstance(v, numbers.Real)}


def evaluate_checkpoint(config: str, checkpoint: str, work_dir: str,
                        cfg_options: Optional[dict] = None, timeout: Optional[float] = None
                        ) -> Dict[str, float]:
    """Evaluate ``checkpoint`` with ``config``'s test set and metric, as ``tools/test.py`` does
    (``deepvit_mm.runtime.prepare_config``, then mmengine's ``Runner.test``), in a fresh process.
    For an ADE20k config: single-scale mIoU on ADE20k val (the recipes' test pipelines have no
    flip; mmseg's test-time augmentation runs only when asked for); for a COCO one, box/mask mAP.

    Args:
        config (str): An mmdet or mmseg config.
        checkpoint (str): The checkpoint file.
        work_dir (str): Where the test run's logs go.
        cfg_options (dict, optional): Config overrides (e.g. the test set's ``data_root``).
        timeout (float, optional): Seconds before giving up. Default: None.

    Returns:
        dict[str, float]: the evaluator's metrics (e.g. ``mIoU``, ``aAcc``, ``mAcc``).

    Raises:
        FileNotFoundError: The checkpoint or config does not exist.
        RuntimeError: The evaluation failed (``isolation.IsolatedError``).
    """
    for path, what in ((checkpoint, 'checkpoint'), (config, 'config')):
        if not os.path.isfile(path):
            raise FileNotFoundError(f'{what} not found: {path!r}')
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    return run_isolated(_test, config, checkpoint, work_dir, cfg_options, device=device,
                        timeout=timeout)
