"""torch.load restricted to an allowlist, and what a failed load met.

* ``load_weights_only``: ``torch.load`` that admits only tensors, plain containers and an
  allowlist. torch >= 2.6: torch's own ``weights_only=True`` with ``serialization.safe_globals``;
  older torch cannot extend its allowlist (no ``safe_globals``, and ``add_safe_globals`` would
  change the whole process), so the file is read through ``RestrictedUnpickler``, which resolves
  a global only if it is on the same allowlist (Python's documented way to restrict unpickling);
  it starts from torch's own allowlist (``torch._weights_only_unpickler``, a private module, tested
  on torch 2.1.0). Neither runs code from the file.
* ``classify_load_error``: what a failed ``torch.load`` / ``load_weights_only`` met. torch raises
  ``pickle.UnpicklingError`` both for a global it refuses and for a truncated pickle, and
  ``RuntimeError`` for a damaged zip archive, so the kind is read from the messages of torch
  2.1 and of the newest tested torch (their texts are in the function).
"""
import _compat_pickle
import pickle
import re
import types
from typing import Any, Callable, Dict, Iterable, List, Tuple, Union

import torch

from ..compat.torch import TORCH_VERSION

__all__ = []

AllowedGlobal = Union[Callable, type, Tuple[Callable, str]]


def _qualified(obj: Any) -> str:
    return f'{obj.__module__}.{obj.__qualname__}'


def _torch_allowed_globals() -> Dict[str, Any]:
    """What torch's own ``weights_only`` unpickler admits (tensors, storages, OrderedDict, ...),
    with the plain data that torch 2.13's list admits and older lists lack: bytes of numpy arrays
    pickled at protocol 2 (``_codecs.encode``), sets, complex numbers, devices, every dtype."""
    import _codecs
    import collections

    from torch import _weights_only_unpickler as wou
    table = dict(wou._get_allowed_globals())
    table.update({'_codecs.encode': _codecs.encode, 'builtins.set': set,
                  'builtins.bytearray': bytearray, 'builtins.complex': complex,
                  'collections.Counter': collections.Counter, 'torch.device': torch.device})
    table.update({f'torch.{n}': getattr(torch, n) for n in dir(torch)
                  if isinstance(getattr(torch, n), (torch.dtype, torch.qscheme))})
    return table


class RestrictedUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` that resolves only allowlisted globals: torch's own
    ``weights_only`` allowlist plus ``allowed``. Every way a pickle names a callable (``GLOBAL``,
    ``STACK_GLOBAL``, ``INST``, ``OBJ``, extension codes) goes through ``find_class``, so a file can
    call nothing else. ``torch.load`` subclasses it (``pickle_module=``) and serves storages
    itself."""

    allowed: Dict[str, Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        # protocol 0-2 pickles name Python 2 modules (__builtin__.set): the names Python maps
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        key = f'{module}.{name}'
        if key in self.allowed:
            return self.allowed[key]
        raise pickle.UnpicklingError(
            f'Weights only load failed: Unsupported global: GLOBAL {key} is not an allowed global')


def _restricted_pickle_module(allowed: Iterable[AllowedGlobal]) -> types.ModuleType:
    table = _torch_allowed_globals()
    for entry in allowed:
        fn, name = entry if isinstance(entry, tuple) else (entry, _qualified(entry))
        table[name] = fn
    unpickler = type('RestrictedUnpickler', (RestrictedUnpickler,), {'allowed': table})
    module = types.ModuleType('deepvit_mm_restricted_pickle')
    module.Unpickler = unpickler
    module.load = lambda f, **kw: unpickler(f, **kw).load()
    return module


def load_weights_only(path: str, map_location: Any, allowed: Iterable[AllowedGlobal]) -> Any:
    """``torch.load(path)`` admitting only tensors, plain containers and ``allowed`` (classes and
    functions, or ``(function, 'module.name')`` pairs standing in for the named global).

    Raises:
        pickle.UnpicklingError: The file holds another global; the message contains
            ``Unsupported global: GLOBAL <module.name>``, as torch's own refusal does.
    """
    allowed = list(allowed)
    if TORCH_VERSION >= (2, 6):
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    return torch.load(path, map_location=map_location, weights_only=False,
                      pickle_module=_restricted_pickle_module(allowed))


def classify_load_error(e: BaseException) -> Tuple[str, List[str]]:
    """``('unsafe', globals)``: the file holds globals that are refused (their names);
    ``('corrupt', [])``: it is truncated or not a readable archive; ``('other', [])``.

    The messages, torch 2.1.0 and 2.13.0: ``Weights only load failed ... Unsupported global:
    GLOBAL a.b`` (2.13; ``RestrictedUnpickler`` says the same on 2.1), ``Unsupported global:
    a.b`` in newer torch's explanation; ``PytorchStreamReader failed reading zip archive: failed
    finding central directory``, ``... failed reading file ...``, ``pickle data was truncated``,
    ``Ran out of input`` (``EOFError``), ``unexpected EOF``.
    """
    import zipfile
    msg = str(e)
    if isinstance(e, pickle.UnpicklingError) and (
            'Unsupported global' in msg or 'Weights only load failed' in msg):
        return 'unsafe', re.findall(r'GLOBAL ([\w.]+)', msg) or re.findall(r'global: ([\w.]+)', msg)
    low = msg.lower()
    if isinstance(e, (EOFError, zipfile.BadZipFile)) or 'zip' in low or 'truncated' in low \
            or 'unexpected eof' in low or 'failed finding central directory' in msg:
        return 'corrupt', []
    return 'other', []
