"""Speed and memory of XCiT backbones and whole models; the logic behind ``tools/benchmark.py``.

Per (model, input size, dtype, pass) it measures:

* **latency**: the median wall-clock time of ``repeats`` calls after ``warmup`` calls (on CUDA
  with ``torch.cuda.synchronize()`` around each call);
* **throughput**: batch size / median latency, in images per second;
* **peak memory**: the most memory the pass needs beyond what the built model and its input
  already hold. On CUDA, ``torch.cuda.max_memory_allocated()`` minus the memory allocated before
  the pass (tensors only), in a spawned process. On CPU, every measurement runs in a fresh process
  forked from a clean fork server, so nothing measured before (e.g. memory that was freed but kept
  by the allocator) lingers in it; the peak resident set of its first pass minus the resident set
  right before it is taken. On Linux the kernel's high-water mark is reset right before the pass
  (``/proc/self/clear_refs``) and read back from ``VmHWM``; elsewhere ``ru_maxrss`` of the fresh
  process is used. The resident set counts every page the pass touches (tensors, allocator
  slack, oneDNN scratch), so it bounds from above the tensor memory CUDA reports.

Passes: ``fwd`` is an eval-mode forward without autograd (inference); ``train`` is a train-mode
forward and backward of a scalar loss (for a backbone the sum of its output means, for a config's
model its losses on random targets), gradients freed between calls, no optimizer step. Dtypes:
``fp32``; ``bf16`` wraps the forward in ``torch.autocast(device, torch.bfloat16)``, the backward
runs outside it.

``compare_with_timm`` times our backbone against timm's own ``forward_intermediates`` on the
same trunk weights followed by the same adapter, in one process with the two interleaved, and
checks that both compute the same.
"""
import csv
import gc
import math
import multiprocessing as mp
import os
import platform
import re
import resource
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['Case', 'parse_size', 'measure', 'measure_isolated', 'TimmBaseline',
           'compare_with_timm', 'COMPARE_MODES', 'evaluate_checkpoint', 'write_report', 'environment']

PASSES = ('fwd', 'train')
DTYPES = ('fp32', 'bf16')
MiB = 1024 * 1024


# --------------------------------------------------------------------------------------------
# what to measure
# --------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One measurement.

    Args:
        model (str): An XCiT arch (``small_12_p8``, timm names too) or a config file path.
        size (tuple[int, int]): Input ``(H, W)``.
        batch (int): Images per call. Default: 1.
        dtype (str): ``fp32`` or ``bf16``. Default: ``fp32``.
        mode (str): ``fwd`` (inference) or ``train`` (forward + backward). Default: ``fwd``.
        device (str): ``cpu`` or ``cuda``. Default: ``cpu``.
        threads (int): ``torch.set_num_threads``; 0 leaves torch's default. Default: 0.
        warmup (int): Untimed calls before timing. Default: 1.
        repeats (int): Timed calls; 0 measures memory only. Default: 3.
        impl (str): ``ours`` (our backbone or the config's model) or ``timm`` (timm's
            ``forward_intermediates`` + our adapter, for an arch). Default: ``ours``.
        cfg_options (dict): Config overrides for a config model; for an arch, ``XCiT``
            keyword arguments (e.g. ``fast_forward=True``). Default: {}.
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

    def __post_init__(self):
        self.size = tuple(self.size)
        if self.dtype not in DTYPES:
            raise ValueError(f'dtype {self.dtype!r}: use one of {", ".join(DTYPES)}')
        if self.mode not in PASSES:
            raise ValueError(f'pass {self.mode!r}: use one of {", ".join(PASSES)}')
        if self.impl not in ('ours', 'timm'):
            raise ValueError(f"impl {self.impl!r}: use 'ours' or 'timm'")
        if self.impl == 'timm' and is_config(self.model):
            raise ValueError('the timm baseline exists for XCiT archs, not for config models')
        if self.batch < 1 or min(self.size) < 1:
            raise ValueError(f'batch {self.batch} and size {self.size} must be positive')

    @property
    def label(self) -> str:
        return os.path.splitext(os.path.basename(self.model))[0] if is_config(self.model) \
            else self.model


def is_config(model: str) -> bool:
    """A model given as a config file rather than an arch name."""
    return model.endswith('.py')


def parse_size(text: str) -> Tuple[int, int]:
    """``'512'`` -> (512, 512); ``'800x1344'`` -> (800, 1344) (height x width)."""
    m = re.fullmatch(r'\s*(\d+)\s*(?:[xX*]\s*(\d+))?\s*', str(text))
    if not m:
        raise ValueError(f'input size {text!r}: give N (square) or HxW, e.g. 512 or 800x1344')
    h = int(m.group(1))
    return h, int(m.group(2) or h)


# --------------------------------------------------------------------------------------------
# models and one call of a pass
# --------------------------------------------------------------------------------------------
class TimmBaseline(nn.Module):
    """timm's own path for our backbone's computation: ``forward_intermediates`` of timm's model
    holding the same trunk weights, then the *same* adapter module, on the same padded input.

    Args:
        backbone (nn.Module): A ``ColumnarBackbone`` (XCiT); its adapter is shared, not copied.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        import timm
        spec = backbone.arch_zoo[backbone.arch]
        # the same stochastic depth, so that a training step does the same work
        dpr = getattr(getattr(backbone.trunk.blocks[0], 'drop_path1', None), 'drop_prob', 0.0)
        self.timm_model = timm.create_model(spec.timm, pretrained=False, num_classes=0,
                                            drop_path_rate=dpr)
        missing, unexpected = self.timm_model.load_state_dict(backbone.trunk.state_dict(),
                                                              strict=False)
        trunk_missing = [k for k in missing if not k.startswith(('cls_attn_blocks.', 'cls_token',
                                                                 'norm.', 'head.'))]
        if unexpected or trunk_missing:
            raise RuntimeError(f'timm baseline: trunk weights do not fit timm\'s {spec.timm} '
                               f'(unexpected {unexpected[:5]}, missing {trunk_missing[:5]})')
        self.adapter = backbone.adapter
        self.indices = list(backbone.out_indices)
        self.pad_to = backbone.pad_to
        self.pad_input = getattr(backbone, 'pad_input', True)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        h, w = x.shape[-2:]
        ph, pw = (-h) % self.pad_to, (-w) % self.pad_to
        if self.pad_input and (ph or pw):
            x = F.pad(x, (0, pw, 0, ph))
        feats = self.timm_model.forward_intermediates(x, indices=self.indices,
                                                      intermediates_only=True)
        return self.adapter(feats)


def _build_backbone(arch: str, **kwargs) -> nn.Module:
    from .backbones import XCiT
    return XCiT(arch, **kwargs)


def _build_config_model(path: str, cfg_options: dict) -> Tuple[nn.Module, str]:
    from mmengine.config import Config
    from mmengine.model.utils import revert_sync_batchnorm
    from mmengine.registry import init_default_scope

    from .engine import task_of
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    task = task_of(cfg)
    if task == 'seg':
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    if cfg.model.get('backbone') is not None:
        cfg.model.backbone.init_cfg = None  # timing needs no weights file
    if 'pretrained' in cfg.model:
        cfg.model.pretrained = None
    return revert_sync_batchnorm(MODELS.build(cfg.model)), task


def _config_samples(model: nn.Module, task: str, case: Case) -> list:
    """Random targets and the meta information a model's heads read."""
    h, w = case.size
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                scale_factor=(1.0, 1.0))
    if task == 'seg':
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample
        samples = []
        for _ in range(case.batch):
            s = SegDataSample()
            s.gt_sem_seg = PixelData(data=torch.randint(0, model.decode_head.num_classes, (1, h, w)))
            s.set_metainfo(meta)
            samples.append(s)
        return samples
    from mmdet.testing import demo_mm_inputs
    num_classes = 80
    roi_head = getattr(model, 'roi_head', None)
    if roi_head is not None and hasattr(roi_head, 'bbox_head'):
        num_classes = getattr(roi_head.bbox_head, 'num_classes', num_classes)
    data = demo_mm_inputs(batch_size=case.batch, image_shapes=[(3, h, w)] * case.batch,
                          num_items=[5] * case.batch, num_classes=num_classes, with_mask=True)
    for s in data['data_samples']:
        s.set_metainfo(meta)
    return data['data_samples']


def _scalar(out) -> torch.Tensor:
    if isinstance(out, dict):  # a model's losses
        return sum(_scalar(v) for k, v in out.items() if 'loss' in k)
    if isinstance(out, (list, tuple)):
        return sum(_scalar(v) for v in out)
    return out.float().mean()


def _prepare(case: Case) -> Tuple[nn.Module, Callable[[], None]]:
    """The model on its device and a zero-argument function running one pass of ``case``."""
    torch.manual_seed(0)
    if is_config(case.model):
        model, task = _build_config_model(case.model, case.cfg_options)
    else:
        model, task = _build_backbone(case.model, **case.cfg_options), None
        if case.impl == 'timm':
            model = TimmBaseline(model)
    device = torch.device(case.device)
    model = model.to(device)
    x = torch.randn(case.batch, 3, *case.size, device=device)
    samples = _config_samples(model, task, case) if task else None
    if samples is not None:
        samples = [s.to(device) for s in samples]
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if case.dtype == 'bf16' \
        else nullcontext()

    def forward(mode):
        if task is None:
            return model(x)
        return model(x, samples, mode=mode)

    if case.mode == 'fwd':
        model.eval()

        def run():
            with torch.no_grad(), amp:
                forward('tensor')
    else:
        model.train()

        def run():
            with amp:
                loss = _scalar(forward('loss'))
            loss.backward()
            model.zero_grad(set_to_none=True)
    return model, run


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------------
def _rss() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _reset_hwm() -> bool:
    """Reset the kernel's resident-set high-water mark of this process (Linux >= 4.0)."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def _hwm(reset_ok: bool) -> int:
    if reset_ok:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == 'darwin' else peak * 1024  # bytes on macOS, KiB on Linux


def _peak_memory(run: Callable[[], None], device: str) -> Tuple[float, str]:
    """Peak memory (MiB) of one call of ``run`` beyond what is held before it, and the method."""
    gc.collect()
    if device.startswith('cuda'):
        _sync(device)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        _sync(device)
        return (torch.cuda.max_memory_allocated() - before) / MiB, 'cuda max_memory_allocated'
    if not os.path.exists('/proc/self/statm'):
        before = _hwm(False)  # fresh process: its peak so far stands in for its current size
        run()
        return (_hwm(False) - before) / MiB, 'ru_maxrss growth (fresh process)'
    before = _rss()
    reset_ok = _reset_hwm()
    run()
    return (_hwm(reset_ok) - before) / MiB, ('VmHWM - VmRSS (fresh process)' if reset_ok
                                            else 'ru_maxrss - VmRSS (fresh process)')


# --------------------------------------------------------------------------------------------
# one measurement, here or in a fresh process
# --------------------------------------------------------------------------------------------
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


def measure(case: Case, memory: bool = True) -> dict:
    """Run ``case`` in this process: its first pass gives the peak memory (when ``memory``),
    then ``warmup`` untimed and ``repeats`` timed calls.

    Returns:
        dict: the case's fields plus ``latency_ms`` (median), ``latency_min_ms``,
        ``throughput`` (images/s), ``cpu_ms`` (median CPU time of the process per call, all
        threads summed: on a loaded machine with ``threads=1`` it estimates the idle latency),
        ``peak_mem_mib``, ``mem_method`` and ``first_call_ms`` (the cold first call, which pays
        one-time costs such as compilation; None when not measured).
    """
    if case.threads > 0:
        torch.set_num_threads(case.threads)
    _, run = _prepare(case)
    out = asdict(case)
    out.update(label=case.label, threads=torch.get_num_threads(), peak_mem_mib=None,
               mem_method=None, first_call_ms=None, latency_ms=None, latency_min_ms=None,
               throughput=None, cpu_ms=None)
    first = 0
    if memory:
        t0 = time.perf_counter()
        out['peak_mem_mib'], out['mem_method'] = _peak_memory(run, case.device)
        out['first_call_ms'] = (time.perf_counter() - t0) * 1e3
        first = 1  # the memory pass was the first (cold) call: it counts as warm-up
    _time_calls(run, case.device, max(case.warmup - first, 0))
    if case.repeats > 0:
        cpu: List[float] = []
        times = _time_calls(run, case.device, case.repeats, cpu)
        med = statistics.median(times)
        out.update(latency_ms=med * 1e3, latency_min_ms=min(times) * 1e3,
                   throughput=case.batch / med, cpu_ms=statistics.median(cpu) * 1e3)
    return out


def _child(case: Case, conn) -> None:
    try:
        conn.send(('ok', measure(case)))
    except BaseException as e:  # report any failure to the parent, which decides
        conn.send(('error', f'{type(e).__name__}: {e}'))
    finally:
        conn.close()


_CTX = None


def _context(device: str = 'cpu'):
    """CPU: a fork server that has imported torch and deepvit_mm but run nothing, so each
    measurement is a cheap fork of it, as clean as a new process. CUDA: fresh ``spawn``
    processes (a process that may have touched CUDA cannot be forked)."""
    global _CTX
    if not device.startswith('cpu'):
        return mp.get_context('spawn')
    if _CTX is None:
        ctx = mp.get_context('forkserver')
        ctx.set_forkserver_preload(['deepvit_mm.benchmark'])
        _CTX = ctx
    return _CTX


def measure_isolated(case: Case, timeout: Optional[float] = None) -> dict:
    """``measure(case)`` in a fresh process (see the module docstring). A crash (e.g. killed for
    memory) or an exception there comes back as ``{'error': message}`` with the case's fields."""
    ctx = _context(case.device)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(case, send), daemon=True)
    proc.start()
    send.close()
    try:
        if not recv.poll(timeout):
            proc.kill()
            status, payload = 'error', f'timed out after {timeout} s'
        else:
            status, payload = recv.recv()
    except EOFError:
        proc.join()
        code = proc.exitcode
        hint = ' (killed: out of memory?)' if code in (-9, 137) else ''
        status, payload = 'error', f'the measuring process died with exit code {code}{hint}'
    proc.join()
    if status == 'ok':
        return payload
    out = asdict(case)
    out.update(label=case.label, error=payload)
    return out


# --------------------------------------------------------------------------------------------
# our backbone against timm's forward_intermediates
# --------------------------------------------------------------------------------------------
def _max_rel_err(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """max over levels of ``max|a - b| / max|b|`` (relative to each level's scale)."""
    return max(float((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-12))
               for x, y in zip(a, b))


COMPARE_MODES = (('fwd', 'fp32'), ('fwd', 'bf16'), ('train', 'fp32'), ('train', 'bf16'))


@contextmanager
def _no_tf32():
    """Full float32 precision for CUDA convs and matmuls inside the block."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _compare_keys() -> List[str]:
    """The result keys of ``compare_with_timm``, one per mode it can time."""
    return [f'{mode}_{dtype}' for mode, dtype in COMPARE_MODES]


def compare_with_timm(arch: str, size: Tuple[int, int], batch: int = 1, device: str = 'cpu',
                      threads: int = 0, warmup: int = 1, repeats: int = 3,
                      memory: bool = True,
                      modes: Sequence[Tuple[str, str]] = COMPARE_MODES,
                      backbone_kwargs: Optional[dict] = None) -> dict:
    """Our backbone against timm's ``forward_intermediates`` + the same adapter.

    Both get the same trunk weights and input; timing interleaves the two call by call (alternating
    which goes first) so that both see the same machine load. Memory (when ``memory``) is measured
    per implementation in fresh processes, as in ``measure_isolated``, on CPU; on CUDA in this
    process (``max_memory_allocated`` is exact per pass).

    ``modes`` are the ``(pass, dtype)`` pairs timed (default: inference and the training step,
    each in fp32 and bf16). ``backbone_kwargs`` go to ``XCiT`` (e.g. ``fast_forward=True`` to
    time the fast forward where ``'auto'`` would not take it).

    Returns:
        dict: ``max_rel_err`` (fp32 eval outputs, see ``_max_rel_err``), ``bf16_max_rel_err``
        (when a bf16 mode is timed), and for each mode, keyed ``{pass}_{dtype}``:
        ``{'ours_ms', 'timm_ms', 'ratio'}`` (medians; ratio = ours / timm) plus
        ``ours_mem_mib``/``timm_mem_mib``.
    """
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    backbone_kwargs = dict(backbone_kwargs or {})
    ours = _build_backbone(arch, **backbone_kwargs)
    for m in ours.modules():  # non-trivial BN statistics, so that the check covers them
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.8, 1.2)
    base = TimmBaseline(ours).to(device)  # copies the trunk weights, shares the adapter
    ours = ours.to(device)
    x = torch.randn(batch, 3, *size, device=device)
    out = dict(model=arch, label=arch, size=tuple(size), batch=batch, device=device,
               threads=torch.get_num_threads(), warmup=warmup, repeats=repeats,
               fast_forward=ours.fast_forward)
    ours.eval()
    base.eval()
    # the check is of the math: TF32 convs/matmuls (cuDNN's default on recent GPUs) would turn
    # float32 rounding differences into ~1e-4 TF32 rounding flips in the adapter's convs
    with torch.no_grad(), _no_tf32():
        out['max_rel_err'] = _max_rel_err(ours(x), base(x))
        if any(dtype == 'bf16' for _, dtype in modes):
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                out['bf16_max_rel_err'] = _max_rel_err(ours(x), base(x))

    def runner(model, mode, dtype):
        amp = torch.autocast(torch.device(device).type, dtype=torch.bfloat16) \
            if dtype == 'bf16' else nullcontext()
        if mode == 'fwd':
            def run():
                model.eval()
                with torch.no_grad(), amp:
                    model(x)
        else:
            def run():
                model.train()
                with amp:
                    loss = _scalar(model(x))
                loss.backward()
                model.zero_grad(set_to_none=True)
        return run

    for mode, dtype in modes:
        runs = dict(ours=runner(ours, mode, dtype), timm=runner(base, mode, dtype))
        for r in runs.values():
            _time_calls(r, device, warmup)
        times = dict(ours=[], timm=[])
        for i in range(repeats):
            for name in (('ours', 'timm') if i % 2 == 0 else ('timm', 'ours')):
                times[name] += _time_calls(runs[name], device, 1)
        res = {f'{k}_ms': statistics.median(v) * 1e3 for k, v in times.items()}
        res['ratio'] = res['ours_ms'] / res['timm_ms']
        if memory and device.startswith('cuda'):  # exact per pass in this process
            for impl in ('ours', 'timm'):
                res[f'{impl}_mem_mib'] = _peak_memory(runs[impl], device)[0]
        elif memory:
            for impl in ('ours', 'timm'):
                m = measure_isolated(Case(arch, size, batch, dtype, mode, device, threads,
                                          warmup=0, repeats=0, impl=impl,
                                          cfg_options=backbone_kwargs))
                res[f'{impl}_mem_mib'] = m.get('peak_mem_mib')
        out[f'{mode}_{dtype}'] = res
    return out


# --------------------------------------------------------------------------------------------
# accuracy of a checkpoint
# --------------------------------------------------------------------------------------------
def evaluate_checkpoint(config: str, checkpoint: str, work_dir: str,
                        cfg_options: Optional[dict] = None) -> Dict[str, float]:
    """Single-scale evaluation of ``checkpoint`` with ``config``'s test set and metric (for an
    ADE20k config: mIoU on ADE20k val), through mmengine's ``Runner.test``.

    Raises:
        ValueError: ``config`` is not an mmseg config.
        FileNotFoundError: The checkpoint or config does not exist.
    """
    from mmengine.runner import Runner

    from .engine import prepare_config, task_of
    if not os.path.isfile(checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {checkpoint!r}')
    cfg = prepare_config(config, work_dir=work_dir, cfg_options=cfg_options, load_from=checkpoint)
    if task_of(cfg) != 'seg':
        raise ValueError(f'{config}: --checkpoint reports mIoU, which needs an mmseg config '
                         f"(default_scope 'mmseg'); for a detector use tools/test.py")
    # Runner.test runs the config's test pipeline as it is (one scale, no flip for the recipes);
    # mmseg's test-time augmentation only runs when asked for (its tools/test.py --tta)
    metrics = Runner.from_cfg(cfg).test()
    return {k: float(v) for k, v in metrics.items()}


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------
def environment(device: str) -> Dict[str, str]:
    """What the numbers depend on: versions, CPU/GPU, threads, load."""
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next((ln.split(':', 1)[1].strip() for ln in f if ln.startswith('model name')), cpu)
    except OSError:
        pass
    env = dict(torch=torch.__version__, python=platform.python_version(), cpu=cpu,
               cpu_count=str(os.cpu_count()), threads=str(torch.get_num_threads()))
    if hasattr(os, 'getloadavg'):
        env['load_avg_1_5_15min'] = ' '.join(f'{v:.1f}' for v in os.getloadavg())
    if device.startswith('cuda') and torch.cuda.is_available():
        env['gpu'] = torch.cuda.get_device_name()
    return env


def _fmt(v, digits=1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return '-'
    return f'{v:.{digits}f}'


def _size_str(size) -> str:
    return f'{size[0]}x{size[1]}'


def _markdown(rows: List[dict], comparisons: List[dict], metrics: Optional[dict],
              command: str, env: Dict[str, str]) -> str:
    lines = ['# Benchmark', '', f'Reproduce: `{command}`', '',
             'Environment: ' + ', '.join(f'{k} {v}' for k, v in env.items()), '']
    if rows:
        lines += ['| model | input | batch | dtype | pass | latency ms (median) | min ms | '
                  'throughput img/s | CPU ms | peak mem MiB | first call ms |',
                  '|---|---|---|---|---|---|---|---|---|---|---|']
        for r in rows:
            if r.get('error'):
                lines.append(f'| {r["label"]} | {_size_str(r["size"])} | {r["batch"]} | '
                             f'{r["dtype"]} | {r["mode"]} | failed: {r["error"]} | | | | | |')
                continue
            lines.append(f'| {r["label"]} | {_size_str(r["size"])} | {r["batch"]} | {r["dtype"]} '
                         f'| {r["mode"]} | {_fmt(r["latency_ms"])} | {_fmt(r["latency_min_ms"])} '
                         f'| {_fmt(r["throughput"], 2)} | {_fmt(r.get("cpu_ms"))} '
                         f'| {_fmt(r["peak_mem_mib"], 0)} '
                         f'| {_fmt(r.get("first_call_ms"))} |')
        methods = sorted({r['mem_method'] for r in rows if r.get('mem_method')})
        lines += ['', 'fwd: inference (eval, no autograd); train: forward + backward. bf16: '
                  'autocast. CPU ms: CPU time of the process per call, all threads summed. Peak '
                  'memory: ' + '; '.join(methods) + ' (growth over the built model and its '
                  'input).', '']
    if comparisons:
        names = [k.replace('_', ' ') for k in _compare_keys()]
        lines += ['## Ours vs timm (`forward_intermediates` + the same adapter, same weights)', '',
                  '| model | input | batch | '
                  + ''.join(f'{n} ours / timm ms | ratio | ' for n in names)
                  + f'peak mem ours / timm MiB ({", ".join(names)}) | max rel err fp32 (bf16) |',
                  '|---|---|---|' + '---|---|' * len(names) + '---|---|']
        for c in comparisons:
            cells = []
            mems = []
            for key in _compare_keys():
                v = c.get(key)
                if v is None:  # not timed in this run
                    cells += ['–', '–']
                    mems.append('–')
                    continue
                cells += [f'{_fmt(v["ours_ms"])} / {_fmt(v["timm_ms"])}', f'{v["ratio"]:.3f}']
                mems.append(f'{_fmt(v.get("ours_mem_mib"), 0)} / {_fmt(v.get("timm_mem_mib"), 0)}')
            bf16_err = f'{c["bf16_max_rel_err"]:.2e}' if 'bf16_max_rel_err' in c else '–'
            lines.append(f'| {c["label"]} | {_size_str(c["size"])} | {c["batch"]} | '
                         + ' | '.join(cells)
                         + f' | {"; ".join(mems)} | {c["max_rel_err"]:.2e} ({bf16_err}) |')
        lines += ['', 'ratio = ours / timm (median latencies, interleaved in one process); '
                  'max rel err = max over levels of max|ours - timm| / max|timm|.', '']
    if metrics:
        lines += ['## Accuracy (single-scale)', '', '| metric | value |', '|---|---|']
        lines += [f'| {k} | {v:.2f} |' for k, v in metrics.items()]
        lines.append('')
    return '\n'.join(lines)


def _plot(rows: List[dict], path: str) -> bool:
    ok = [r for r in rows if not r.get('error') and r.get('latency_ms') is not None]
    if not ok:
        return False
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    series: Dict[str, List[dict]] = {}
    for r in ok:
        series.setdefault(f'{r["label"]} {r["dtype"]} {r["mode"]}', []).append(r)
    for name, rs in series.items():
        rs = sorted(rs, key=lambda r: r['size'][0] * r['size'][1])
        mp_ = [r['size'][0] * r['size'][1] / 1e6 for r in rs]
        axes[0].plot(mp_, [r['latency_ms'] for r in rs], marker='o', label=name)
        if all(r.get('peak_mem_mib') is not None for r in rs):
            axes[1].plot(mp_, [r['peak_mem_mib'] for r in rs], marker='o', label=name)
    for ax, ylabel in zip(axes, ('latency (ms, median)', 'peak memory (MiB)')):
        ax.set_xlabel('input megapixels (H x W / 1e6)')
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle('cost vs input resolution')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(out_dir: str, rows: List[dict], comparisons: List[dict],
                 metrics: Optional[dict], command: str, env: Dict[str, str]) -> Dict[str, str]:
    """Write ``benchmark.md``, ``benchmark.csv`` (one row per measurement; ``compare.csv`` for
    the timm comparison) and ``benchmark.png`` into ``out_dir``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = dict(md=os.path.join(out_dir, 'benchmark.md'))
    with open(paths['md'], 'w') as f:
        f.write(_markdown(rows, comparisons, metrics, command, env))
    if rows:
        paths['csv'] = os.path.join(out_dir, 'benchmark.csv')
        keys = ['label', 'model', 'size', 'batch', 'dtype', 'mode', 'impl', 'device', 'threads',
                'warmup', 'repeats', 'latency_ms', 'latency_min_ms', 'throughput', 'cpu_ms',
                'peak_mem_mib', 'mem_method', 'first_call_ms', 'error']
        with open(paths['csv'], 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction='ignore')
            w.writeheader()
            for r in rows:
                w.writerow({**r, 'size': _size_str(r['size'])})
        if _plot(rows, os.path.join(out_dir, 'benchmark.png')):
            paths['png'] = os.path.join(out_dir, 'benchmark.png')
    if comparisons:
        paths['compare_csv'] = os.path.join(out_dir, 'compare.csv')
        with open(paths['compare_csv'], 'w', newline='') as f:
            w = csv.writer(f)
            w.writerow(['label', 'size', 'batch', 'pass', 'ours_ms', 'timm_ms', 'ratio',
                        'ours_mem_mib', 'timm_mem_mib', 'max_rel_err_fp32', 'max_rel_err_bf16'])
            for c in comparisons:
                for key in _compare_keys():
                    v = c.get(key)
                    if v is not None:
                        w.writerow([c['label'], _size_str(c['size']), c['batch'], key,
                                    v['ours_ms'], v['timm_ms'], v['ratio'], v.get('ours_mem_mib'),
                                    v.get('timm_mem_mib'), c['max_rel_err'],
                                    c.get('bf16_max_rel_err')])
    if metrics:
        paths['metrics'] = paths['md']
    return paths
