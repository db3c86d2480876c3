"""One fresh process per measurement: a process's freed memory stays with its allocator and
``ru_maxrss`` only grows, so nothing measured before may share it. On CPU the process is forked
from a fork server that has imported torch and deepvit_mm but run nothing; on CUDA it is spawned
(a process that has touched CUDA cannot be forked)."""
import multiprocessing as mp
import resource
from typing import Any, Callable, Optional

__all__ = []


class IsolatedError(RuntimeError):
    """A measurement that failed in its own process: an exception, a crash or a time-out."""


def _child(fn: Callable, args: tuple, kwargs: dict, mem_limit_gib: float, conn) -> None:
    try:
        if mem_limit_gib > 0:  # fail with "can't allocate memory" rather than swap or be killed
            cap = int(mem_limit_gib * 2 ** 30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        conn.send(('ok', fn(*args, **kwargs)))
    except BaseException as e:  # report any failure to the parent, which decides
        conn.send(('error', f'{type(e).__name__}: {str(e).strip()[-300:]}'))
    finally:
        conn.close()


def run_isolated(fn: Callable, *args, device: str = 'cpu', timeout: Optional[float] = None,
                 mem_limit_gib: float = 0.0, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` in a fresh process; its (picklable) return value.

    Args:
        fn (Callable): A module-level function (pickled by name).
        device (str): ``'cpu'``: forked from the fork server; else spawned. Default: ``'cpu'``.
        timeout (float, optional): Seconds before the process is killed. Default: None.
        mem_limit_gib (float): The process's address-space cap (``RLIMIT_AS``); 0: none.
            Default: 0.

    Raises:
        IsolatedError: ``fn`` raised, the process died, or it timed out.
    """
    if str(device).startswith('cpu'):
        ctx = mp.get_context('forkserver')
        ctx.set_forkserver_preload(['deepvit_tools.benchmark'])
    else:
        ctx = mp.get_context('spawn')
    recv, send = ctx.Pipe(duplex=False)
    # not a daemon: an evaluation starts dataloader workers, which daemons may not
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
        hint = ' (killed: out of memory?)' if proc.exitcode in (-9, 137) else ''
        payload = f'the measuring process died with exit code {proc.exitcode}{hint}'
    finally:
        if status != 'ok' and proc.is_alive():  # timed out, or we were interrupted
            proc.kill()
        proc.join()
    if status != 'ok':
        raise IsolatedError(payload)
    return payload
