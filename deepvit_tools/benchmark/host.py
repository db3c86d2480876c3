"""The host's side of a backbone's training step (``pass_runner``'s) on a GPU: wall, queueing and
device time per step, host waits (``torch.cuda.set_sync_debug_mode``), and where the host's time
goes from ``torch.profiler``'s public ``events()`` (``host_split``); docs/speed.md.
"""
import statistics
import time
import warnings
from typing import Dict, Optional, Tuple

import torch

from .batches import backbone_input
from .measure import pass_runner, timings
from .models import build_backbone

__all__ = ['host_profile', 'host_split']

# the CUDA runtime's and driver's calls that queue device work: kernels, copies, fills
_LAUNCHES = ('cudaLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernel', 'cuLaunchKernelEx',
             'cudaGraphLaunch', 'cudaMemcpyAsync', 'cudaMemsetAsync')


def _device_reads(module, args) -> None:
    """What every backbone call once did: read whether its input is finite, ask free memory."""
    x = args[0]
    bool(torch.isfinite(x).all())
    torch.cuda.mem_get_info(x.device)


def _time_steps(run, steps: int) -> Dict[str, float]:
    host, events = [], []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        begin.record()
        run()
        end.record()
        host.append(time.perf_counter() - t)
        events.append((begin, end))
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    device = [b.elapsed_time(e) for b, e in events]
    return dict(step_ms=1e3 * wall / steps, host_ms=1e3 * statistics.median(host),
                device_ms=statistics.median(device))


def _waits(run) -> int:
    """Calls that waited for the device during one step (the sync debug mode's warnings)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode('warn')
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum('synchroniz' in str(w.message) for w in caught)


def _covered_us(intervals) -> float:
    """Microseconds covered by the union of ``(start, end)`` intervals."""
    covered, reach = 0.0, float('-inf')
    for start, end in sorted(intervals):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


def host_split(events, steps: int, profiled_s: float) -> Dict[str, float]:
    """Where the host's time of ``steps`` profiled steps went, per step: ``profiled_ms``,
    ``ops_ms`` (inside torch's operators, each moment once: the union of their time ranges, thread
    by thread; the profiler's parent links miss some nested calls on torch 2.1), ``launch_ms``
    (CUDA launch, copy and fill calls), ``python_ms`` (the rest) and ``kernels``.

    Args:
        events: ``torch.profiler.profile(...).events()`` of the ``steps`` steps.
        steps (int): Steps profiled.
        profiled_s (float): The host's wall time of those steps, in seconds.
    """
    from torch.autograd import DeviceType
    ops = ('aten::', 'autograd::engine::evaluate_function', 'CompiledFunction',
           'Torch-Compiled Region')
    launch_us = kernels = 0
    spans: Dict[int, list] = {}
    for e in events:
        if e.device_type == DeviceType.CUDA:
            kernels += 1
        elif e.name.startswith(_LAUNCHES):
            launch_us += e.cpu_time_total
        elif e.name.startswith(ops):
            spans.setdefault(e.thread, []).append((e.time_range.start, e.time_range.end))
    profiled_ms = 1e3 * profiled_s / steps
    ops_ms = sum(_covered_us(s) for s in spans.values()) / 1e3 / steps
    return dict(profiled_ms=profiled_ms, ops_ms=ops_ms, launch_ms=launch_us / 1e3 / steps,
                python_ms=profiled_ms - ops_ms, kernels=kernels / steps)


def _profiled(run, steps: int, trace: Optional[str]) -> Dict[str, float]:
    """``host_split`` of ``steps`` profiled steps (CPU and CUDA); a Chrome trace into ``trace``."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run()
        host = time.perf_counter() - start
        torch.cuda.synchronize()
    if trace:
        prof.export_chrome_trace(trace)
    return host_split(prof.events(), steps, host)


def host_profile(arch: str, size: Tuple[int, int] = (800, 1344), batch: int = 2,
                 dtype: str = 'fp16', steps: int = 20, warmup: int = 5, rounds: int = 3,
                 trace: Optional[str] = None, **kwargs) -> Dict[str, dict]:
    """``arch``'s training step on CUDA without and with the per-call device reads, interleaved
    ``rounds`` times (medians of the rounds' medians), and ``host_split`` of 3 profiled steps.

    Args:
        arch (str): A backbone arch; ``kwargs`` go to its constructor (``compile_blocks=True``).
        trace (str, optional): Also write the profiled steps' Chrome trace to this file.

    Returns:
        dict: ``{'as built': {...}, 'reads per call': {...}}`` with ``step_ms``, ``host_ms``,
        ``device_ms``, ``waits``; ``'split'``: ``host_split``'s figures and ``first_call_s``.
    """
    device = 'cuda'
    model = build_backbone(arch, **kwargs).to(device)
    x = backbone_input(size, batch, device)
    run = pass_runner(model, lambda: model(x), 'train', device, dtype)
    first_call_s = timings({'first': run}, 0, 1)['first'].times[0]
    for _ in range(warmup - 1):
        run()
    results: Dict[str, list] = {'as built': [], 'reads per call': []}
    for _ in range(rounds):
        for name in results:
            hook = model.register_forward_pre_hook(_device_reads) \
                if name == 'reads per call' else None
            try:
                results[name].append(dict(_time_steps(run, steps), waits=_waits(run)))
            finally:
                if hook is not None:
                    hook.remove()
    out = {name: {k: statistics.median(r[k] for r in rounds_) for k in rounds_[0]}
           for name, rounds_ in results.items()}
    out['split'] = dict(_profiled(run, 3, trace), first_call_s=first_call_s)
    return out
