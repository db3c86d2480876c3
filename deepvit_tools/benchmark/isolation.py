"""One fresh process per measurement.

A process's memory never fully goes back: pages freed by an earlier measurement stay with the
allocator and are reused without raising the resident peak, and ``ru_maxrss`` only grows. So
every measurement runs in a process of its own. On CPU that process is forked from a fork server
which has imported torch and deepvit_mm but run nothing (cheap, and as clean as a new
interpreter); on CUDA it is spawned (a process that may have touched CUDA cannot be forked).
"""
import multiprocessing as mp
from typing import Any, Callable, Optional

from .memory import limit_address_space

__all__ = ['IsolatedError', 'run_isolated']

_FORKSERVER = None


class IsolatedError(RuntimeError):
    """A measurement that failed in its own process: an exception there, a crash (e.g. killed for
    memory) or a time-out. The message says which."""


def _context(device: str):
    global _FORKSERVER
    if not str(device).startswith('cpu'):
        return mp.get_context('spawn')
    if _FORKSERVER is None:
        ctx = mp.get_context('forkserver')
        ctx.set_forkserver_preload(['deepvit_tools.benchmark'])
        _FORKSERVER = ctx
    return _FORKSERVER


def _child(fn: Callable, args: tuple, kwargs: dict, mem_limit_gib: float, conn) -> None:
    try:
        if mem_limit_gib > 0:
            limit_address_space(mem_limit_gib)
        conn.send(('ok', fn(*args, **kwargs)))
    except BaseException as e:  # report any failure to the parent, which decides
        conn.send(('error', f'{type(e).__name__}: {str(e).strip()[-300:]}'))
    finally:
        conn.close()


def run_isolated(fn: Callable, *args, device: str = 'cpu', timeout: Optional[float] = None,
                 mem_limit_gib: float = 0.0, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` in a fresh process; its (picklable) return value.

    Args:
        fn (Callable): A module-level function (it is pickled by name).
        *args: Its positional arguments (picklable).
        device (str): ``'cpu'``: fork from the clean fork server; else spawn. Default: ``'cpu'``.
        timeout (float, optional): Seconds before the process is killed. Default: None (no limit).
        mem_limit_gib (float): Address-space cap of the child (``memory.limit_address_space``);
            0: none. Default: 0.
        **kwargs: Its keyword arguments (picklable).

    Raises:
        IsolatedError: ``fn`` raised, the process died, or it timed out.
    """
    ctx = _context(device)
    recv, send = ctx.Pipe(duplex=False)
    # not a daemon: a measurement may start processes of its own (an evaluation's dataloader
    # workers), which daemonic processes may not; it is killed below instead if we stop early
    proc = ctx.Process(target=_child, args=(fn, args, kwargs, mem_limit_gib, send))
    proc.start()
    send.close()
    status, payload = 'error', 'interrupted'
    try:
        if recv.poll(timeout):
            status, payload = recv.recv()
        else:
            payload = f'timed out after {timeout} s'
    except EOFError:
        proc.join()
        code = proc.exitcode
        hint = ' (killed: out of memory?)' if code in (-9, 137) else ''
        payload = f'the measuring process died with exit code {code}{hint}'
    finally:
        if status != 'ok' and proc.is_alive():  # timed out, or we were interrupted
            proc.kill()
        proc.join()
    if status != 'ok':
        raise IsolatedError(payload)
    return payload
