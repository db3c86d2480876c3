"""Reading a checkpoint file without running anything in it, and refusing damaged ones.

``.pth``/``.pt``/``.bin`` files (torch zip or legacy pickle) are read through
``unpickling.load_weights_only``: nothing but tensors, plain containers and ``safe_globals()``
is admitted, on every supported torch. A torch zip file is first checked record by record against
its CRC-32 (``integrity.zip_problem``), so a corrupted file is refused before any weight reaches a
model. ``.safetensors`` files are read by safetensors after a check of their header. Config text
that mmengine would evaluate is made harmless (``stored_config``). Trusted files (``trust``) are
read as plain PyTorch would.
"""
import argparse
import importlib
import os
import re
from typing import List, Set

import numpy as np
import torch

from .errors import SHARDED_HINT, CheckpointError
from .fetch import resolve_checkpoint
from .integrity import is_safetensors, is_zip, structure_problem, zip_problem
from .stored_config import neutralise_config_text
from .trust import is_trusted, trust_hint
from .unpickling import classify_load_error, load_weights_only

__all__ = ['safe_globals', 'read_checkpoint']


# --------------------------------------------------------------------------------------------
# what a checkpoint may hold besides tensors
# --------------------------------------------------------------------------------------------
def _history_buffer_statistics() -> Set[str]:
    """The names of ``HistoryBuffer``'s statistics methods, which mmengine pickles as
    ``getattr(HistoryBuffer, name)``: the four defaults and those registered in this process
    (its private ``_statistics_methods``, mmengine 0.10.3 and 0.10.7)."""
    from mmengine.logging import HistoryBuffer
    # reason: `_statistics_methods` is filled only once a HistoryBuffer is built in this process,
    # so a fresh `--resume` process would find it empty; the four defaults are named explicitly
    return {'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods}


def _pickled_array_globals() -> List:
    """The numpy callables and types a pickle of arrays, scalars and dtypes refers to, as the
    ``(callable, 'module.name')`` pairs and types ``load_weights_only`` takes: the array
    constructors under both numpy 1's and numpy 2's module names (numpy 2 moved ``numpy.core`` to
    ``numpy._core``; pickles name whichever the writer had), ``ndarray``, ``dtype`` and the
    ``numpy.dtypes.<Name>DType`` classes dtypes are pickled as (numpy 1.25+). Tested with numpy
    1.26.4 and 2.4.6."""
    multiarray = importlib.import_module(
        'numpy._core.multiarray' if np.lib.NumpyVersion(np.__version__) >= '2.0.0'
        else 'numpy.core.multiarray')
    arrays = [(getattr(multiarray, fn), f'numpy.{pkg}.multiarray.{fn}')
              for fn in ('_reconstruct', 'scalar') for pkg in ('core', '_core')]
    dtype_classes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith('DType')]
    return [*arrays, np.ndarray, np.dtype, *dtype_classes]


def _history_buffer_getattr(obj, name: str):
    """Stand-in for ``getattr`` in unpickling: mmengine pickles ``HistoryBuffer``'s statistics
    methods as ``getattr(HistoryBuffer, 'mean')``. Only those exact lookups are honoured; anything
    else (``getattr(os, 'system')``) is refused, so this cannot be used to reach code."""
    from mmengine.logging import HistoryBuffer
    if obj is HistoryBuffer and name in _history_buffer_statistics():
        return getattr(obj, name)
    raise CheckpointError(f'refusing getattr({obj!r}, {name!r}) while unpickling a checkpoint')


def safe_globals() -> list:
    """Every non-tensor type ``read_checkpoint`` admits, and why; none of them can run code.

    * mmengine's own checkpoints: ``HistoryBuffer`` (message hub) with the ``getattr`` stand-in
      above for its statistics methods, numpy arrays, scalars and dtypes (log values, RNG state);
    * DINO training checkpoints: ``argparse.Namespace`` (their ``args``), an attribute bag.
    """
    from mmengine.logging import HistoryBuffer
    return [HistoryBuffer, (_history_buffer_getattr, 'builtins.getattr'), *_pickled_array_globals(),
            argparse.Namespace]


def _corrupt(path: str, problem: str) -> CheckpointError:
    return CheckpointError(f'{path!r} is truncated or corrupt: {problem}. Its bytes are not the '
                           'ones that were saved (a damaged disk or copy, an interrupted transfer): '
                           'nothing was loaded from it. Download or save it again.')


def read_checkpoint(path: str, map_location='cpu') -> dict:
    """Read a checkpoint file without executing anything it contains.

    Args:
        path (str): A ``.pth``/``.pt``/``.bin`` (torch) or ``.safetensors`` file, ``~/...``, an
            ``http(s)://`` URL or an ``hf-hub:`` name (fetched once, see ``fetch``).
        map_location: Passed to ``torch.load``. Default: ``'cpu'``.

    Returns:
        dict: What the file holds (for safetensors, a flat name -> tensor dict), with stored
        config text that is not plain data replaced (see ``stored_config``).

    Raises:
        FileNotFoundError: The path does not exist or is a folder.
        CheckpointError: The file is truncated/corrupt (a record fails its CRC-32...), or holds
            objects that are not plain data.
    """
    path = resolve_checkpoint(path)
    if os.path.getsize(path) == 0:
        raise CheckpointError(f'checkpoint {path!r} is empty (0 bytes): the file was not fully '
                              'written; download or save it again.')
    if is_safetensors(path):
        return _read_safetensors(path, map_location)
    if is_zip(path):
        problem = zip_problem(path)
        if problem:
            raise _corrupt(path, problem)
    trusted = is_trusted(path)
    try:
        if trusted:
            obj = torch.load(path, map_location=map_location, weights_only=False)
        else:
            obj = load_weights_only(path, map_location, safe_globals())
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, zip errors...
        # an unsafe file's own traceback says nothing more (the globals it names are in the message)
        raise _refusal(path, e) from (None if _kind(e)[0] == 'unsafe' else e)
    if not trusted and isinstance(obj, dict):
        neutralise_config_text(obj, path)
    return obj


def _read_safetensors(path: str, map_location) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:  # safetensors checks that the header covers exactly the bytes after it
        return load_file(path, device=str(map_location) if map_location else 'cpu')
    except (SafetensorError, ValueError, OSError) as e:
        raise CheckpointError(f'cannot read safetensors file {path!r} ({e}); it is truncated '
                              'or corrupt: download or save it again.') from e


def _kind(e: Exception):
    """``classify_load_error``'s (kind, globals found) of a failed ``torch.load``."""
    if isinstance(e, CheckpointError):  # an allowed stand-in refused its arguments
        return 'unsafe', re.findall(r'GLOBAL ([\w.]+)', str(e))
    return classify_load_error(e)


def _refusal(path: str, e: Exception) -> CheckpointError:
    """The error a failed ``torch.load`` of ``path`` is reported as: objects that are not plain
    data (a sharded checkpoint's part among them), a truncated or corrupt file, or another file."""
    msg = str(e)
    kind, found = _kind(e)
    if kind == 'unsafe':
        if any('sharded_tensor' in g or 'FlatParameter' in g for g in found):
            return CheckpointError(f'{path!r} is one process\'s part of a sharded checkpoint: '
                                   f'{SHARDED_HINT} ' + trust_hint(path))
        return CheckpointError(
            f'refusing to load {path!r}: it contains pickled objects that are not plain data '
            f'({", ".join(sorted(set(found))) or msg.splitlines()[-1][:200]}). Loading it could '
            'run arbitrary code. Re-save only its tensors (a state dict) or convert it to '
            '.safetensors. ' + trust_hint(path))
    if kind == 'corrupt':
        return CheckpointError(f'cannot read {path!r}: the file is truncated or corrupt ({msg[:200]}). '
                               'Download or save it again.')
    return CheckpointError(f'cannot read checkpoint {path!r}: {type(e).__name__}: {msg[:300]}. '
                           'It is not a PyTorch or safetensors checkpoint, or it is corrupt.')


def is_readable_checkpoint(path: str) -> bool:
    """The file exists and is complete: a torch zip or safetensors file whose checksums and
    structure check, or a legacy (non-zip) torch file that reads safely (a killed writer leaves a
    truncated one)."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return False
    try:
        if is_safetensors(path) or is_zip(path):
            return structure_problem(path) is None
        read_checkpoint(path)  # legacy pickle format: no cheaper structural check
        return True
    except Exception:
        return False
