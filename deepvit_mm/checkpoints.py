"""One safe place for every path that reads weights.

* ``read_checkpoint`` reads ``.pth``/``.pt``/``.bin`` (torch zip or legacy pickle) with
  ``torch.load(weights_only=True)`` and ``.safetensors``; nothing in a checkpoint can run code. The
  only non-tensor types admitted are those mmengine 0.10.7 itself writes into its checkpoints
  (``HistoryBuffer``, numpy arrays/scalars/dtypes) and, in place of ``getattr``, a stand-in that can
  only fetch a ``HistoryBuffer`` statistics method by name.
* ``install_mmengine_loader`` routes mmengine's local-file loading (``load_from``, ``--resume``,
  ``tools/test.py CKPT``) through ``read_checkpoint``, so those paths are just as safe.
* ``load_backbone_weights`` matches a state dict against a module, refuses a checkpoint of another
  architecture with the offending tensor names, and returns a ``LoadReport`` that says exactly what
  was loaded, resized, dropped on purpose and left at init.
"""
import os
import re
import zipfile
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

__all__ = [
    'CheckpointError', 'LoadReport', 'read_checkpoint', 'extract_state_dict',
    'load_backbone_weights', 'install_mmengine_loader', 'mmengine_safe_globals',
    'find_resumable_checkpoint', 'is_readable_checkpoint'
]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot or must not be loaded; the message says why and what to do."""


# --------------------------------------------------------------------------------------------
# reading files
# --------------------------------------------------------------------------------------------
def _history_buffer_getattr(obj, name: str):
    """Stand-in for ``getattr`` in unpickling: mmengine pickles ``HistoryBuffer``'s statistics
    methods as ``getattr(HistoryBuffer, 'mean')``. Only those exact lookups are honoured; anything
    else (``getattr(os, 'system')``) is refused, so this cannot be used to reach code."""
    from mmengine.logging import HistoryBuffer
    # reason: `_statistics_methods` is filled only once a HistoryBuffer is built in this process,
    # so a fresh `--resume` process would find it empty; the four defaults are named explicitly.
    allowed = {'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods}
    if obj is HistoryBuffer and name in allowed:
        return getattr(obj, name)
    raise CheckpointError(f'refusing getattr({obj!r}, {name!r}) while unpickling a checkpoint')


def mmengine_safe_globals() -> list:
    """The types mmengine's own checkpoints hold besides tensors; none of them can run code."""
    from mmengine.logging import HistoryBuffer
    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray
    dtype_classes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith('DType')]
    return [
        HistoryBuffer, multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype,
        *dtype_classes, (_history_buffer_getattr, 'builtins.getattr')
    ]


def _is_safetensors(path: str) -> bool:
    if path.endswith('.safetensors'):
        return True
    with open(path, 'rb') as f:
        head = f.read(9)
    # safetensors: 8-byte little-endian header length, then a JSON object
    return len(head) == 9 and head[8:9] == b'{' and int.from_bytes(head[:8], 'little') < (1 << 28)


def read_checkpoint(path: str, map_location='cpu') -> dict:
    """Read a checkpoint file without executing anything it contains.

    Args:
        path (str): A ``.pth``/``.pt``/``.bin`` (torch) or ``.safetensors`` file.
        map_location: Passed to ``torch.load``. Default: ``'cpu'``.

    Returns:
        dict: What the file holds (for safetensors, a flat name -> tensor dict).

    Raises:
        FileNotFoundError: The path does not exist.
        CheckpointError: The file is truncated/corrupt, or holds objects that are not plain data.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f'checkpoint not found: {path!r}. Check the path (relative paths are resolved from '
            f'{os.getcwd()!r}) or download the weights first.')
    if os.path.getsize(path) == 0:
        raise CheckpointError(f'checkpoint {path!r} is empty (0 bytes): the file was not fully '
                              'written; download or save it again.')
    if _is_safetensors(path):
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            return load_file(path, device=str(map_location) if map_location else 'cpu')
        except (SafetensorError, ValueError, OSError) as e:
            raise CheckpointError(f'cannot read safetensors file {path!r} ({e}); it is truncated '
                                  'or corrupt: download or save it again.') from e
    try:
        with torch.serialization.safe_globals(mmengine_safe_globals()):
            obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, zip errors...
        msg = str(e)
        if 'Unsupported global' in msg or 'Weights only load failed' in msg \
                or isinstance(e, CheckpointError):
            found = re.findall(r'GLOBAL ([\w.]+)', msg) or re.findall(r'global: ([\w.]+)', msg)
            raise CheckpointError(
                f'refusing to load {path!r}: it contains pickled objects that are not plain data '
                f'({", ".join(sorted(set(found))) or msg.splitlines()[-1][:200]}). Loading it could '
                'run arbitrary code. If you trust and need it, re-save only its tensors '
                '(a state dict) or convert it to .safetensors.') from None
        if isinstance(e, (EOFError, zipfile.BadZipFile)) or 'zip' in msg.lower() \
                or 'truncated' in msg.lower() or 'failed finding central directory' in msg:
            raise CheckpointError(f'cannot read {path!r}: the file is truncated or corrupt ({msg[:200]}). '
                                  'Download or save it again.') from e
        raise CheckpointError(f'cannot read checkpoint {path!r}: {type(e).__name__}: {msg[:300]}. '
                              'It is not a PyTorch or safetensors checkpoint, or it is corrupt.') from e
    return obj


def extract_state_dict(obj) -> Dict[str, torch.Tensor]:
    """Unwrap the usual containers: ``{'model': ...}`` (official XCiT/CaiT/DeiT releases),
    ``{'state_dict': ...}`` (mmengine/mmdet/mmseg), ``{'module': ...}``; strip ``module.``."""
    if not isinstance(obj, Mapping):
        raise CheckpointError(f'expected a dict of tensors in the checkpoint, got {type(obj).__name__}')
    for key in ('state_dict', 'model', 'module', 'model_ema'):
        if key in obj and isinstance(obj[key], Mapping):
            obj = obj[key]
            break
    sd = {k[7:] if k.startswith('module.') else k: v for k, v in obj.items() if torch.is_tensor(v)}
    if not sd:
        raise CheckpointError('the checkpoint holds no tensors (keys: '
                              f'{", ".join(list(obj)[:10])}); it is not a model checkpoint.')
    return sd


# --------------------------------------------------------------------------------------------
# matching a state dict against a module
# --------------------------------------------------------------------------------------------
def _summarize(keys: Iterable[str], limit: int = 12) -> str:
    """Group keys by their prefix up to the first number so a report stays one readable line."""
    groups: Dict[str, int] = {}
    for k in keys:
        m = re.match(r'^(.*?\.)\d+\.', k)
        g = (m.group(1) + '*') if m else k
        groups[g] = groups.get(g, 0) + 1
    items = [f'{g} ({n})' if n > 1 else g for g, n in groups.items()]
    more = f', ... {len(items) - limit} more' if len(items) > limit else ''
    return ', '.join(items[:limit]) + more


@dataclass
class LoadReport:
    """What ``load_backbone_weights`` did, tensor by tensor."""
    source: str = ''
    loaded: List[str] = field(default_factory=list)
    resized: List[Tuple[str, tuple, tuple]] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)
    left_at_init: List[str] = field(default_factory=list)

    def format(self) -> str:
        lines = [f'weights from {self.source}: loaded {len(self.loaded)} tensors']
        if self.resized:
            lines.append('  resized: ' + ', '.join(f'{k} {tuple(a)} -> {tuple(b)}'
                                                   for k, a, b in self.resized))
        if self.dropped:
            lines.append(f'  dropped on purpose ({len(self.dropped)}): {_summarize(self.dropped)}')
        if self.left_at_init:
            lines.append(f'  left at init ({len(self.left_at_init)}): '
                         f'{_summarize(self.left_at_init)}')
        return '\n'.join(lines)


def _matches(key: str, patterns: Sequence[str]) -> bool:
    return any(re.match(p, key) for p in patterns)


def load_backbone_weights(
        module: nn.Module,
        state_dict: Mapping[str, torch.Tensor],
        *,
        source: str,
        drop: Sequence[str] = (),
        init_ok: Sequence[str] = (),
        resize: Optional[Callable[[str, torch.Tensor, torch.Tensor], Optional[torch.Tensor]]] = None,
        describe: Optional[Callable[[Mapping[str, torch.Tensor]], str]] = None,
) -> LoadReport:
    """Copy matching tensors into ``module`` or refuse the whole checkpoint.

    Args:
        module (nn.Module): Receives the weights; its ``state_dict`` keys are the targets.
        state_dict (Mapping): Already converted to ``module``'s key layout.
        source (str): Where the weights came from, for messages.
        drop (Sequence[str]): Regexes of checkpoint keys that are dropped on purpose (head...).
        init_ok (Sequence[str]): Regexes of module keys that may stay at their init (adapter...).
        resize (Callable, optional): ``resize(key, ckpt_tensor, target)`` returns a tensor of the
            target shape (e.g. a resampled position embedding) or None when it cannot.
        describe (Callable, optional): Says what architecture a refused checkpoint looks like.

    Returns:
        LoadReport: loaded / resized / dropped / left at init.

    Raises:
        CheckpointError: Shape mismatches, unknown tensors or missing trunk tensors; the message
            names them. Nothing is copied in that case.
    """
    target = module.state_dict()
    report = LoadReport(source=source)
    new_sd, mismatched, unexpected = {}, [], []
    for k, v in state_dict.items():
        if k in target:
            if v.shape == target[k].shape:
                new_sd[k] = v
                report.loaded.append(k)
                continue
            resized = resize(k, v, target[k]) if resize is not None else None
            if resized is not None:
                new_sd[k] = resized
                report.resized.append((k, tuple(v.shape), tuple(resized.shape)))
                continue
            mismatched.append(f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(target[k].shape)}')
        elif _matches(k, drop):
            report.dropped.append(k)
        else:
            unexpected.append(k)
    missing = [k for k in target
               if k not in new_sd and k not in state_dict and not _matches(k, init_ok)]
    if mismatched or unexpected or missing:
        parts = []
        if mismatched:
            parts.append(f'{len(mismatched)} tensors of another shape: ' + '; '.join(mismatched[:8])
                         + (' ...' if len(mismatched) > 8 else ''))
        if unexpected:
            parts.append(f'{len(unexpected)} tensors the model does not have: {_summarize(unexpected)}')
        if missing:
            parts.append(f'{len(missing)} model tensors missing from it: {_summarize(missing)}')
        hint = describe(state_dict) if describe is not None else ''
        # what the checkpoint is comes first: the tensor lists that follow can be long
        raise CheckpointError(
            f'{source} does not fit {type(module).__name__}'
            + (f'. {hint}' if hint else '')
            + '. Use a checkpoint of the same architecture, or set `arch` to match it. '
            + ' | '.join(parts))
    for k in target:
        if k not in new_sd:
            report.left_at_init.append(k)
    module.load_state_dict(new_sd, strict=False)
    return report


# --------------------------------------------------------------------------------------------
# mmengine integration
# --------------------------------------------------------------------------------------------
def _mmengine_load_from_local(filename: str, map_location=None) -> dict:
    filename = os.path.expanduser(filename)
    obj = read_checkpoint(filename, map_location=map_location or 'cpu')
    if isinstance(obj, Mapping) and obj and all(torch.is_tensor(v) for v in obj.values()) \
            and filename.endswith('.safetensors'):
        obj = {'state_dict': dict(obj)}
    return obj


def _atomic_local_backend():
    from mmengine.fileio.backends import LocalBackend

    class AtomicLocalBackend(LocalBackend):
        """mmengine's local file backend, but a file appears complete or not at all: data goes to
        a temporary file in the same folder, is flushed to disk, then renamed over the target.
        A run killed while saving a checkpoint leaves no half-written ``.pth``."""

        def put(self, obj: bytes, filepath) -> None:
            filepath = os.fspath(filepath)
            os.makedirs(os.path.dirname(filepath) or '.', exist_ok=True)
            tmp = f'{filepath}.tmp{os.getpid()}'
            try:
                with open(tmp, 'wb') as f:
                    f.write(obj)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, filepath)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)

        def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
            self.put(obj.encode(encoding), filepath)

    return AtomicLocalBackend


def install_mmengine_loader() -> None:
    """Route mmengine's local checkpoint I/O through this module.

    Reading (``load_from``, ``resume``, ``tools/test.py``) uses ``read_checkpoint``: mmengine's own
    loader either fails on torch >= 2.6 or, with ``weights_only=False``, executes whatever the file
    contains. Writing goes through an atomic local backend (temp file + rename).
    """
    from mmengine.fileio import register_backend
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes='', force=True)(_mmengine_load_from_local)
    register_backend('local', _atomic_local_backend(), force=True, prefixes='')


def is_readable_checkpoint(path: str) -> bool:
    """Cheap structural check: the file exists and is a complete torch zip or safetensors file
    (a killed writer leaves a truncated one)."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return False
    try:
        if _is_safetensors(path):
            from safetensors import safe_open
            with safe_open(path, 'pt') as f:
                f.keys()
            return True
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except Exception:
        return False


def find_resumable_checkpoint(work_dir: str) -> Optional[str]:
    """The newest complete checkpoint of a run, for ``--resume`` without a path.

    Trusts ``work_dir/last_checkpoint`` when it names a readable file; otherwise (a run killed
    while saving) falls back to the newest readable ``iter_*.pth``/``epoch_*.pth`` and logs which
    one and why. Returns None when the run saved none.
    """
    from mmengine.logging import print_log
    candidates = []
    last = os.path.join(work_dir, 'last_checkpoint')
    named = None
    if os.path.isfile(last):
        with open(last) as f:
            named = f.read().strip()
        if named and is_readable_checkpoint(named):
            return named
    for name in os.listdir(work_dir) if os.path.isdir(work_dir) else []:
        m = re.fullmatch(r'(iter|epoch)_(\d+)\.pth', name)
        if m:
            candidates.append((int(m.group(2)), os.path.join(work_dir, name)))
    for _, path in sorted(candidates, reverse=True):
        if is_readable_checkpoint(path):
            if named:
                print_log(f'last_checkpoint names {named!r}, which is missing or incomplete (a run '
                          f'killed while saving?); resuming from {path!r} instead.',
                          logger='current', level=30)
            return path
        print_log(f'skipping incomplete checkpoint {path!r}', logger='current', level=30)
    return None
