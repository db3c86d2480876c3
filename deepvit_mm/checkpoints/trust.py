"""Files the user trusts explicitly: read as plain PyTorch would, stored config text kept.

A pickle can run any code, so this is opt-in per file: the environment variable
``DEEPVIT_MM_TRUSTED_CHECKPOINTS`` (paths separated by ``os.pathsep``, for the command-line tools)
or ``with trusted_checkpoints(path):`` (Python).
"""
import contextlib
import contextvars
import os
from typing import FrozenSet, Iterator

__all__ = ['trusted_checkpoints']

TRUST_ENV = 'DEEPVIT_MM_TRUSTED_CHECKPOINTS'
# the files trusted by the enclosing `with trusted_checkpoints(...)` blocks of this thread/task
_TRUSTED: contextvars.ContextVar[FrozenSet[str]] = contextvars.ContextVar(
    'deepvit_mm_trusted_checkpoints', default=frozenset())


def _canonical(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def is_trusted(path: str) -> bool:
    """Whether ``path`` is named in ``DEEPVIT_MM_TRUSTED_CHECKPOINTS`` or ``trusted_checkpoints``."""
    listed = [p for p in os.environ.get(TRUST_ENV, '').split(os.pathsep) if p]
    return _canonical(path) in {_canonical(p) for p in listed} | _TRUSTED.get()


@contextlib.contextmanager
def trusted_checkpoints(*paths: str) -> Iterator[None]:
    """Read these files as plain PyTorch would (``weights_only=False``, stored config text kept
    as is) inside the ``with`` block. Only for files whose origin you trust: a pickle can run any
    code. Command-line tools: list the files in ``DEEPVIT_MM_TRUSTED_CHECKPOINTS`` instead."""
    token = _TRUSTED.set(_TRUSTED.get() | {_canonical(p) for p in paths})
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def trust_hint(path: str) -> str:
    """The sentence every refusal that trust would lift ends with."""
    return (f'If you trust this file, allow it explicitly: {TRUST_ENV}={path} (command line) or '
            '`with deepvit_mm.checkpoints.trusted_checkpoints(path):` (Python).')
