"""Peak memory of one call: host resident set on CPU, allocated tensor memory on CUDA.

CPU: the kernel's resident-set high-water mark of this process is reset right before the call
(``/proc/self/clear_refs``, Linux >= 4.0) and read back after it (``VmHWM``); the growth over the
resident set before the call is what the call needed. The resident set counts every page the call
touches (tensors, allocator slack, oneDNN scratch), so it bounds the tensor memory from above.
Without ``/proc`` the process's ``ru_maxrss`` (which never goes down) stands in, which is only
meaningful in a fresh process: run measurements through ``isolation.run_isolated``.

CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus the memory
allocated before the call (tensors only, without the caching allocator's slack).

``tensor_peak`` adds a device-independent count: the peak of the allocations minus frees that
``torch.profiler`` records during the call.
"""
import gc
import os
import resource
import sys
from typing import Any, Callable, Tuple

import torch

__all__ = ['MiB', 'synchronize', 'current_rss', 'reset_peak_rss', 'peak_rss', 'peak_memory', 'tensor_peak',
           'limit_address_space']

MiB = 1024 * 1024


def profiler_event_start_ns(event: Any) -> int:
    """Start time (ns) of a kineto event of ``torch.profiler``."""
    if hasattr(event, 'start_ns'):
        return event.start_ns()
    return event.start_us() * 1000  # torch < 2.2


def current_rss() -> int:
    """Resident set size of this process now, in bytes (Linux ``/proc/self/statm``)."""
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def reset_peak_rss() -> bool:
    """Reset this process's resident-set high-water mark to its current resident set.

    Returns:
        bool: Whether the kernel took the reset (Linux >= 4.0); if not, ``peak_rss`` falls back
        to ``ru_maxrss``, the peak since the process started.
    """
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # 5: reset the peak RSS (Documentation/filesystems/proc.rst)
        return True
    except OSError:
        return False


def peak_rss(since_reset: bool = True) -> int:
    """Peak resident set of this process in bytes: ``VmHWM`` (since the last ``reset_peak_rss``)
    when ``since_reset``, else ``ru_maxrss`` (since the process started)."""
    if since_reset:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == 'darwin' else peak * 1024  # bytes on macOS, KiB on Linux


def synchronize(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for on CPUs."""
    if str(device).startswith('cuda'):
        torch.cuda.synchronize()


def peak_memory(run: Callable[[], object], device: str = 'cpu') -> Tuple[float, str, dict]:
    """Peak memory of one call of ``run`` beyond what is held before it.

    Args:
        run (Callable): The call to measure (its return value is dropped after the call).
        device (str): ``'cpu'`` (peak resident set) or ``'cuda'`` (``max_memory_allocated``).
            Default: ``'cpu'``.

    Returns:
        tuple[float, str, dict]: the growth in MiB, the method used (for the report), and the
        absolute readings in MiB: ``before`` (resident set or allocated memory before the call)
        and ``peak`` (the whole process's peak during the call).
    """
    gc.collect()
    if str(device).startswith('cuda'):
        synchronize(device)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        synchronize(device)
        peak = torch.cuda.max_memory_allocated()
        method = 'cuda max_memory_allocated'
    elif not os.path.exists('/proc/self/statm'):
        before = peak_rss(False)  # fresh process: its peak so far stands in for its current size
        run()
        peak = peak_rss(False)
        method = 'ru_maxrss growth (fresh process)'
    else:
        before = current_rss()
        reset_ok = reset_peak_rss()
        run()
        peak = peak_rss(reset_ok)
        method = 'VmHWM - VmRSS (fresh process)' if reset_ok else 'ru_maxrss - VmRSS (fresh process)'
    return (peak - before) / MiB, method, dict(before=before / MiB, peak=peak / MiB)


def tensor_peak(run: Callable[[], object]) -> float:
    """Peak tensor memory (MiB) one call of ``run`` allocates on top of what exists before it:
    the running sum of allocations minus frees that ``torch.profiler`` (``profile_memory=True``)
    records, in time order. Unlike the resident set it leaves out allocator slack and library
    buffers, on any device."""
    prof = torch.profiler.profile(profile_memory=True)
    with prof:
        run()
    # reason: the profiler's public tables aggregate per operator; the time-ordered memory events
    # are only reachable through kineto's results
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == '[memory]'),
                    key=profiler_event_start_ns)
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return peak / MiB


def limit_address_space(gib: float) -> None:
    """Cap this process's address space (``RLIMIT_AS``) at ``gib`` GiB, so that a measurement that
    does not fit fails with "can't allocate memory" instead of swapping the machine or waking the
    OOM killer. Meant for a measuring child process: the cap cannot be raised again."""
    cap = int(gib * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
