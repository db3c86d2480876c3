"""Peak memory of one call: resident set on CPU, allocated tensor memory on CUDA, and the tensor
peak that ``torch.profiler`` records on either (docs/benchmark.md, "How memory is measured")."""
import gc
import json
import os
import resource
import sys
import tempfile
from typing import Callable, Tuple

import torch

__all__ = ['MiB', 'tensor_peak']

MiB = 1024 * 1024


def current_rss() -> int:
    """Resident set size of this process now, in bytes (Linux ``/proc/self/statm``)."""
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def reset_peak_rss() -> bool:
    """Reset this process's resident-set high-water mark (``VmHWM``); whether the kernel took it
    (Linux >= 4.0)."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # 5: reset the peak RSS (Documentation/filesystems/proc.rst)
        return True
    except OSError:
        return False


def peak_rss(since_reset: bool = True) -> int:
    """Peak resident set in bytes: ``VmHWM`` (since ``reset_peak_rss``) when ``since_reset``, else
    ``ru_maxrss`` (since the process started)."""
    if since_reset:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == 'darwin' else peak * 1024  # bytes on macOS, KiB on Linux


def peak_memory(run: Callable[[], object], device: str = 'cpu') -> Tuple[float, str, dict]:
    """Peak memory of one call of ``run`` beyond what is held before it.

    Args:
        run (Callable): The call to measure.
        device (str): ``'cpu'`` (peak resident set) or ``'cuda'`` (``max_memory_allocated``).
            Default: ``'cpu'``.

    Returns:
        tuple[float, str, dict]: the growth in MiB, the method (for the report), and the absolute
        readings in MiB: ``before`` the call and the process's ``peak`` during it.
    """
    gc.collect()
    if str(device).startswith('cuda'):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        peak, method = torch.cuda.max_memory_allocated(), 'cuda max_memory_allocated'
    elif not os.path.exists('/proc/self/statm'):  # a fresh process's peak so far is its size
        before = peak_rss(False)
        run()
        peak, method = peak_rss(False), 'ru_maxrss growth (fresh process)'
    else:
        before = current_rss()
        reset_ok = reset_peak_rss()
        run()
        peak = peak_rss(reset_ok)
        method = f'{"VmHWM" if reset_ok else "ru_maxrss"} - VmRSS (fresh process)'
    return (peak - before) / MiB, method, dict(before=before / MiB, peak=peak / MiB)


def tensor_peak(run: Callable[[], object]) -> float:
    """Peak tensor memory (MiB) one call of ``run`` allocates on top of what exists before it: the
    running sum, in time order, of the allocations and frees (``[memory]`` events) in
    ``torch.profiler``'s trace (``profile_memory=True``, ``export_chrome_trace``), on any device.
    Unlike the resident set it leaves out allocator slack and library buffers."""
    with torch.profiler.profile(profile_memory=True) as prof:
        run()
    # reason: the public tables (events(), key_averages()) sum memory per operator, which hides
    # the peaks inside operators; the trace keeps every allocation and free in time order
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(os.path.join(tmp, 'trace.json'))
        with open(os.path.join(tmp, 'trace.json')) as f:
            events = [e for e in json.load(f)['traceEvents'] if e.get('name') == '[memory]']
    current = peak = 0
    for e in sorted(events, key=lambda e: e['ts']):
        current += e['args']['Bytes']
        peak = max(peak, current)
    return peak / MiB
