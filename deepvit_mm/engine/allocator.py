"""CPU memory allocators for training and test runs: glibc ``mallopt`` tuning, and tcmalloc.

glibc's malloc serves every allocation above 32 MiB (its highest ``M_MMAP_THRESHOLD``) with a
fresh ``mmap`` and unmaps it when freed, so a training step whose feature maps exceed that size
faults in new pages for each of them, every step. tcmalloc keeps freed memory in the process and
hands it out again: for XCiT-S12/8 training at 800x1344, batch 2, that removes almost all of the
faults and makes the step much faster (docs/speed.md#memory-allocator).

A library cannot swap the allocator of a running process: the tools (``tools/train.py``,
``tools/test.py``, the benchmark tools) call :func:`preload_tcmalloc` first thing, which starts
the tool again with tcmalloc in ``LD_PRELOAD`` when it finds one. ``DEEPVIT_MALLOC`` decides:

* unset, ``auto`` or ``tcmalloc``: tcmalloc if the system has it (``libtcmalloc_minimal.so.4`` or
  ``libtcmalloc.so.4``: ``apt install libtcmalloc-minimal4``, ``dnf install gperftools-libs``,
  ``conda install -c conda-forge gperftools``), else glibc with :func:`keep_freed_cpu_memory`;
* ``glibc``: the system's malloc, never restarted;
* a path: that tcmalloc library.
"""
import ctypes
import ctypes.util
import glob
import os
import sys
from typing import Optional

__all__ = ['keep_freed_cpu_memory', 'cpu_allocator', 'preload_tcmalloc', 'setup_cpu_malloc',
           'allocator_note', 'release_free_memory']

MALLOC_ENV = 'DEEPVIT_MALLOC'
_RESTARTED_ENV = 'DEEPVIT_MALLOC_RESTARTED'  # set on the restart: never restart twice
# tcmalloc reports every allocation above 1 GiB on stderr by default; a big feature map is one
_QUIET_LARGE_ALLOCS = dict(TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=str(2**40))


def cpu_allocator(maps: str = '/proc/self/maps') -> str:
    """The malloc this process runs on: ``'tcmalloc'`` or ``'jemalloc'`` when one is mapped into
    it (``LD_PRELOAD`` or linked), else ``'glibc'``; ``'unknown'`` where ``maps`` cannot be read
    (not Linux)."""
    try:
        with open(maps) as f:
            text = f.read()
    except OSError:
        return 'unknown'
    for name in ('tcmalloc', 'jemalloc'):
        if f'/lib{name}' in text:
            return name
    return 'glibc'


def find_tcmalloc() -> Optional[str]:
    """A tcmalloc library to preload: ``DEEPVIT_MALLOC`` when it is a path, else the first of
    ``libtcmalloc_minimal`` / ``libtcmalloc`` the dynamic linker knows (``ldconfig``), in the active
    conda environment or virtualenv; None if there is none (or ``DEEPVIT_MALLOC=glibc``).

    Raises:
        FileNotFoundError: ``DEEPVIT_MALLOC`` names a file that does not exist.
    """
    choice = os.environ.get(MALLOC_ENV, 'auto').strip()
    if choice.lower() == 'glibc':
        return None
    if choice.lower() not in ('', 'auto', 'tcmalloc'):
        if not os.path.isfile(choice):
            raise FileNotFoundError(
                f'{MALLOC_ENV}={choice!r}: no such file. Give the path of a tcmalloc library '
                f'(e.g. /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4), "auto" to find '
                f'one, or "glibc" to keep the system malloc.')
        return os.path.abspath(choice)
    for name in ('tcmalloc_minimal', 'tcmalloc'):
        for prefix in (os.environ.get('CONDA_PREFIX'), os.environ.get('VIRTUAL_ENV')):
            if prefix:
                found = sorted(glob.glob(os.path.join(prefix, 'lib', f'lib{name}.so*')))
                if found:
                    return found[0]
        soname = ctypes.util.find_library(name)  # e.g. 'libtcmalloc_minimal.so.4' (ldconfig -p)
        if soname:
            return soname
    return None


def preload_tcmalloc(script: str) -> Optional[str]:
    """Start this Python program again with tcmalloc preloaded, when one is found (see the module
    docstring); otherwise return.

    Args:
        script: The calling tool's ``__file__``. Only a program run as that script is restarted:
            called from anything else (a test importing the tool, a notebook) it just returns.

    The new program has the same process id, interpreter flags, arguments and environment, plus
    ``LD_PRELOAD`` and ``DEEPVIT_MALLOC_RESTARTED=1``, so a launcher (torchrun, Slurm) that waits
    for this process waits for it. Call it before the program does anything it should not do twice
    (it runs from the start again). Nothing happens on a system other than Linux, when tcmalloc or
    jemalloc is already loaded, after one restart, or with ``DEEPVIT_MALLOC=glibc``.

    Returns:
        The allocator this process runs on (``cpu_allocator()``) when it goes on here.

    Raises:
        SystemExit: ``DEEPVIT_MALLOC`` names a file that does not exist (the message says what
            to give instead).
    """
    current = cpu_allocator()
    if (not sys.platform.startswith('linux') or current != 'glibc'
            or os.environ.get(_RESTARTED_ENV) or not _runs_as(script)):
        return current
    try:
        library = find_tcmalloc()
    except FileNotFoundError as e:  # DEEPVIT_MALLOC names no file: the tool stops, saying so
        raise SystemExit(str(e)) from None
    if library is None:
        return current
    env = dict(os.environ, **{_RESTARTED_ENV: '1'})
    env['LD_PRELOAD'] = ':'.join(p for p in (library, os.environ.get('LD_PRELOAD', '')) if p)
    for key, value in _QUIET_LARGE_ALLOCS.items():
        env.setdefault(key, value)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)


def setup_cpu_malloc(script: str) -> str:
    """A training or test tool's CPU run: restarted on tcmalloc when the system has it
    (:func:`preload_tcmalloc`), else glibc kept from returning freed memory below 32 MiB
    (:func:`keep_freed_cpu_memory`).

    Returns:
        The allocator the run goes on with (what :func:`allocator_note` reports).
    """
    malloc = preload_tcmalloc(script)
    keep_freed_cpu_memory()
    return malloc


def release_free_memory() -> bool:
    """Hand the memory this process's malloc holds free back to the system: before another process
    needs it (a benchmark's memory measurement in a fresh process, after this one timed models at
    detection sizes: tcmalloc would otherwise keep all they freed; docs/speed.md#memory-allocator).
    tcmalloc: ``MallocExtension_ReleaseFreeMemory``; glibc: ``malloc_trim``.

    Returns:
        bool: Whether the allocator was asked to (False for others, or without the call).
    """
    calls = dict(tcmalloc=('MallocExtension_ReleaseFreeMemory', ()), glibc=('malloc_trim', (0,)))
    name, args = calls.get(cpu_allocator(), (None, ()))
    if name is None:
        return False
    try:
        getattr(ctypes.CDLL(None), name)(*args)
    except (OSError, AttributeError):
        return False
    return True


def allocator_note(allocator: str) -> str:
    """The line a CPU run logs about its allocator, with what to do when it is glibc's."""
    if allocator != 'glibc':
        return f'CPU memory allocator: {allocator}'
    why = ('no tcmalloc found' if os.environ.get(MALLOC_ENV, 'auto').lower() in ('', 'auto')
           else f'{MALLOC_ENV}={os.environ[MALLOC_ENV]}')
    return (f'CPU memory allocator: glibc ({why}). Feature maps above 32 MiB are faulted in '
            f'afresh each step on glibc; install tcmalloc (apt install libtcmalloc-minimal4, '
            f'or conda install -c conda-forge gperftools) and the tools preload it: '
            f'docs/speed.md#memory-allocator')


def _runs_as(script: str) -> bool:
    """Whether this process is ``python [flags] script ...``."""
    try:
        return bool(sys.argv and sys.argv[0]) and os.path.samefile(sys.argv[0], script)
    except OSError:
        return False


def keep_freed_cpu_memory(trim_threshold_gb: float = 1.0) -> bool:
    """Let glibc's malloc keep freed tensor memory in the process instead of returning it.

    By default glibc serves each large allocation (a feature map: tens of MB) with a fresh
    ``mmap`` and unmaps it when freed, so every layer's output is written to new pages and pays a
    page fault per 4 KiB (what that costs: docs/speed.md#memory-allocator). This raises the mmap
    threshold to glibc's maximum (32 MiB) and keeps up to ``trim_threshold_gb`` of freed heap.
    Allocations above 32 MiB still get fresh pages: only a caching allocator
    (:func:`preload_tcmalloc`) reuses those. The tools call it for CPU runs on glibc; it is a no-op
    elsewhere (tcmalloc or jemalloc loaded, not glibc).

    Returns:
        bool: Whether the settings were applied.
    """
    if not sys.platform.startswith('linux') or cpu_allocator() != 'glibc':
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    return bool(mallopt(m_mmap_threshold, 32 * 2**20)
                and mallopt(m_trim_threshold, int(trim_threshold_gb * 2**30))
                and mallopt(m_top_pad, 64 * 2**20))
