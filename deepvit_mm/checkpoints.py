"""Every way weights enter a model: safe reading, one matcher, one report.

Reading (``read_checkpoint``)
    ``.pth``/``.pt``/``.bin`` files (torch zip or legacy pickle) are read with
    ``torch.load(weights_only=True)``, ``.safetensors`` with safetensors; ``http(s)://`` paths are
    downloaded once into torch's hub cache (atomically) and then read the same way. Nothing in a
    checkpoint can run code: the only objects admitted besides tensors and plain containers are
    listed in ``safe_globals()``. Config text that mmengine stores in checkpoints and would later
    *evaluate* (``meta['config']`` on ``--resume``, ``meta['cfg']`` and
    ``message_hub.runtime_info.cfg`` in inferencers given no config) is kept only when it is plain
    data (assignments of literals and ``dict(...)``); otherwise it is replaced by a config that
    stops with a message saying how to proceed.

    A checkpoint you trust that holds other objects or code-bearing config text: name it in the
    environment variable ``DEEPVIT_MM_TRUSTED_CHECKPOINTS`` (paths separated by ``os.pathsep``) or
    wrap the call in ``with trusted_checkpoints(path):``; it is then read with
    ``weights_only=False``, as plain PyTorch would.

Matching (``load_weights``)
    One matcher for every path: the backbones' ``init_cfg``, ``load_from``, ``--resume``,
    ``tools/test.py``, mmengine's ``load_checkpoint`` (mmdet's ``init_detector``, mmseg's
    ``init_model``) and the inferencers (``DetInferencer``, ``MMSegInferencer``). The part of a
    checkpoint that belongs to a deepvit_mm backbone is converted from any supported layout
    (official XCiT/CaiT releases, timm, DINO, official XCiT detectors/segmentors, ours) and must fit
    it, or the whole checkpoint is refused with the tensor names; the rest of the model loads what
    fits and reports what does not (another class count: ``skipped``). Non-finite weights are
    refused by name. One report says what was loaded, resized, dropped on purpose, skipped and
    left at init.

mmengine integration (``install_mmengine_loader``, run by ``import deepvit_mm``)
    mmengine's checkpoint reader for local files and ``http(s)://`` URLs becomes
    ``read_checkpoint`` (for every model: that only adds the refusal of code), and mmengine's
    ``load_state_dict`` hands models that contain a deepvit_mm backbone to ``load_weights``; other
    models are loaded by mmengine as before. Nothing else in mmengine (file I/O of other files,
    other models' loading) changes.
"""
import argparse
import ast
import contextlib
import importlib
import logging
import os
import re
import zipfile
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from .torch_compat import load_weights_only

__all__ = [
    'CheckpointError', 'LoadReport', 'safe_globals', 'TRUST_ENV', 'trusted_checkpoints',
    'resolve_checkpoint', 'read_checkpoint', 'extract_state_dict', 'load_weights',
    'install_mmengine_loader', 'find_resumable_checkpoint', 'is_readable_checkpoint',
    'require_complete_model'
]

TRUST_ENV = 'DEEPVIT_MM_TRUSTED_CHECKPOINTS'


class CheckpointError(RuntimeError):
    """A checkpoint that cannot or must not be loaded; the message says why and what to do."""


# --------------------------------------------------------------------------------------------
# what a checkpoint may hold besides tensors
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


def safe_globals() -> list:
    """Every non-tensor type ``read_checkpoint`` admits, and why; none of them can run code.

    * mmengine's own checkpoints: ``HistoryBuffer`` (message hub) with the ``getattr`` stand-in
      above for its statistics methods, numpy arrays, scalars and dtypes (log values, RNG state);
    * DINO training checkpoints: ``argparse.Namespace`` (their ``args``), an attribute bag.
    """
    from mmengine.logging import HistoryBuffer
    multiarray = importlib.import_module(
        'numpy._core.multiarray' if np.lib.NumpyVersion(np.__version__) >= '2.0.0'
        else 'numpy.core.multiarray')
    # arrays pickled under numpy 2 name numpy._core, under numpy 1 numpy.core: read both
    arrays = [(getattr(multiarray, fn), f'numpy.{pkg}.multiarray.{fn}')
              for fn in ('_reconstruct', 'scalar') for pkg in ('core', '_core')]
    # numpy >= 1.25 pickles dtypes as numpy.dtypes.<Name>DType classes
    dtype_classes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith('DType')]
    return [
        HistoryBuffer, *arrays, np.ndarray, np.dtype, *dtype_classes,
        (_history_buffer_getattr, 'builtins.getattr'), argparse.Namespace
    ]


# --------------------------------------------------------------------------------------------
# trust
# --------------------------------------------------------------------------------------------
_TRUSTED: List[str] = []


def _canonical(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def _is_trusted(path: str) -> bool:
    listed = [p for p in os.environ.get(TRUST_ENV, '').split(os.pathsep) if p] + _TRUSTED
    return _canonical(path) in {_canonical(p) for p in listed}


@contextlib.contextmanager
def trusted_checkpoints(*paths: str) -> Iterator[None]:
    """Read these files as plain PyTorch would (``weights_only=False``, stored config text kept
    as is) inside the ``with`` block. Only for files whose origin you trust: a pickle can run any
    code. Command-line tools: list the files in ``DEEPVIT_MM_TRUSTED_CHECKPOINTS`` instead."""
    _TRUSTED.extend(paths)
    try:
        yield
    finally:
        for p in paths:
            _TRUSTED.remove(p)


def _trust_hint(path: str) -> str:
    return (f'If you trust this file, allow it explicitly: {TRUST_ENV}={path} (command line) or '
            '`with deepvit_mm.checkpoints.trusted_checkpoints(path):` (Python).')


# --------------------------------------------------------------------------------------------
# locating files
# --------------------------------------------------------------------------------------------
def _is_url(path: str) -> bool:
    return path.startswith(('http://', 'https://'))


def _download(url: str) -> str:
    """Download ``url`` once into ``torch.hub.get_dir()/checkpoints`` and return the local path.

    ``torch.hub.download_url_to_file`` writes to a temporary file in the same folder and renames
    it when complete, so an interrupted download never leaves a file under the final name."""
    from urllib.parse import urlparse
    name = os.path.basename(urlparse(url).path)
    if not name:
        raise CheckpointError(f'cannot tell a file name from the URL {url!r}: it must end in the '
                              'checkpoint\'s file name (…/model.pth).')
    folder = os.path.join(torch.hub.get_dir(), 'checkpoints')
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        from mmengine.logging import print_log
        print_log(f'downloading {url} to {path}', logger='current')
        try:
            torch.hub.download_url_to_file(url, path, progress=False)
        except Exception as e:  # urllib's HTTPError, URLError, timeouts...
            raise CheckpointError(f'cannot download {url!r}: {e}. Check the URL and the network, '
                                  'or download the file yourself and give its local path.') from e
    return path


def resolve_checkpoint(path: str) -> str:
    """A local, existing checkpoint file for ``path``: ``~`` expanded, URLs downloaded (cached).

    Raises:
        FileNotFoundError: The path does not exist, or names a folder (the message lists the
            checkpoints in it).
    """
    path = os.fspath(path)
    if _is_url(path):
        return _download(path)
    full = os.path.expanduser(path)
    if os.path.isdir(full):
        found = sorted(n for n in os.listdir(full)
                       if n.endswith(('.pth', '.pt', '.bin', '.safetensors')))
        raise FileNotFoundError(
            f'{path!r} is a folder, not a checkpoint file: give the file '
            + (f'(it holds {", ".join(found[:6])}{" ..." if len(found) > 6 else ""})'
               if found else '(it holds no .pth/.safetensors file)') + '.')
    if not os.path.isfile(full):
        raise FileNotFoundError(
            f'checkpoint not found: {path!r}. Check the path (relative paths are resolved from '
            f'{os.getcwd()!r}) or download the weights first.')
    return full


# --------------------------------------------------------------------------------------------
# reading files
# --------------------------------------------------------------------------------------------
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
        path (str): A ``.pth``/``.pt``/``.bin`` (torch) or ``.safetensors`` file, ``~/...``, or
            an ``http(s)://`` URL (downloaded once into torch's hub cache).
        map_location: Passed to ``torch.load``. Default: ``'cpu'``.

    Returns:
        dict: What the file holds (for safetensors, a flat name -> tensor dict), with stored
        config text that is not plain data replaced (see the module docstring).

    Raises:
        FileNotFoundError: The path does not exist or is a folder.
        CheckpointError: The file is truncated/corrupt, or holds objects that are not plain data.
    """
    path = resolve_checkpoint(path)
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
    trusted = _is_trusted(path)
    try:
        if trusted:
            obj = torch.load(path, map_location=map_location, weights_only=False)
        else:
            obj = load_weights_only(path, map_location, safe_globals())
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, zip errors...
        msg = str(e)
        if 'Unsupported global' in msg or 'Weights only load failed' in msg \
                or isinstance(e, CheckpointError):
            found = re.findall(r'GLOBAL ([\w.]+)', msg) or re.findall(r'global: ([\w.]+)', msg)
            raise CheckpointError(
                f'refusing to load {path!r}: it contains pickled objects that are not plain data '
                f'({", ".join(sorted(set(found))) or msg.splitlines()[-1][:200]}). Loading it could '
                'run arbitrary code. Re-save only its tensors (a state dict) or convert it to '
                '.safetensors. ' + _trust_hint(path)) from None
        if isinstance(e, (EOFError, zipfile.BadZipFile)) or 'zip' in msg.lower() \
                or 'truncated' in msg.lower() or 'unexpected eof' in msg.lower() \
                or 'failed finding central directory' in msg:
            raise CheckpointError(f'cannot read {path!r}: the file is truncated or corrupt ({msg[:200]}). '
                                  'Download or save it again.') from e
        raise CheckpointError(f'cannot read checkpoint {path!r}: {type(e).__name__}: {msg[:300]}. '
                              'It is not a PyTorch or safetensors checkpoint, or it is corrupt.') from e
    if not trusted and isinstance(obj, dict):
        _neutralise_config_text(obj, path)
    return obj


# --------------------------------------------------------------------------------------------
# config text stored in checkpoints
# --------------------------------------------------------------------------------------------
# where mmengine (Runner.resume) and its inferencers (given no config) evaluate stored text
_CONFIG_TEXT_PLACES = (('meta', 'config'), ('meta', 'cfg'), ('message_hub', 'runtime_info', 'cfg'))


def _literal_problem(node: ast.AST) -> Optional[str]:
    """None if ``node`` is plain data (literals, containers, ``dict(k=...)``), else what it is."""
    if isinstance(node, ast.Constant):
        return None
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return next(filter(None, map(_literal_problem, node.elts)), None)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            return f'dict unpacking at line {node.lineno}'
        return next(filter(None, map(_literal_problem, [*node.keys, *node.values])), None)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literal_problem(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict' \
            and all(isinstance(a, ast.Dict) for a in node.args) and len(node.args) <= 1 \
            and all(kw.arg is not None for kw in node.keywords):
        # dict(k=v) and dict({'non-identifier key': v}), as Config.pretty_text writes them
        return next(filter(None, (_literal_problem(n) for n in
                                  [*node.args, *(kw.value for kw in node.keywords)])), None)
    return f'{type(node).__name__} at line {getattr(node, "lineno", "?")}: {ast.unparse(node)[:60]}'


def _literal_value(node: ast.AST):
    """The value of a node ``_literal_problem`` accepted (``dict(k=v)`` calls included)."""
    if isinstance(node, ast.Call):
        return {**(_literal_value(node.args[0]) if node.args else {}),
                **{kw.arg: _literal_value(kw.value) for kw in node.keywords}}
    if isinstance(node, ast.Dict):
        return {_literal_value(k): _literal_value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal_value(e) for e in node.elts]
    return ast.literal_eval(node)


def config_text_problem(text: str) -> Optional[str]:
    """None if a stored config text is plain data that mmengine can evaluate without running
    anything of the checkpoint's: top-level assignments of literals and ``dict(...)`` (what
    mmengine's ``Config.pretty_text`` writes), no ``_base_``, and ``custom_imports`` only of
    modules already imported. Otherwise a short description of the first offending statement."""
    import sys
    if not isinstance(text, str):
        return f'a {type(text).__name__}, not text'
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        return f'not valid Python ({e.msg} at line {e.lineno})'
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            return f'{type(stmt).__name__} statement at line {stmt.lineno}: {ast.unparse(stmt)[:60]}'
        name = stmt.targets[0].id
        if name in ('dict', '_base_') or name.startswith('__'):
            return f'assignment to {name!r} at line {stmt.lineno}'
        problem = _literal_problem(stmt.value)
        if problem:
            return problem
        if name == 'custom_imports':
            value = _literal_value(stmt.value)
            imports = value.get('imports', []) if isinstance(value, dict) else value
            imports = [imports] if isinstance(imports, str) else imports
            new = [m for m in imports if not isinstance(m, str) or m not in sys.modules]
            if new:
                return f'custom_imports of modules not imported yet: {", ".join(new)}'
    return None


def _refusing_config(where: str, problem: str, path: str, resume: bool) -> str:
    """Config text that stops evaluation with our message (it is ours, not the checkpoint's).
    ``resume``: the text mmengine's ``Runner.resume`` evaluates (``meta['config']``), whatever
    config the run was given; else the one inferencers evaluate when given no config."""
    if resume:
        remedy = ('mmengine evaluates it on --resume whatever config you give. To start from '
                  'these weights without resuming, use load_from=CKPT (or --cfg-options '
                  'load_from=CKPT) instead of --resume.')
    else:
        remedy = ('Give the config file explicitly: DetInferencer(model=CONFIG, weights=CKPT) or '
                  'init_detector(CONFIG, CKPT) (mmdet), MMSegInferencer(model=CONFIG, '
                  'weights=CKPT) or init_model(CONFIG, CKPT) (mmseg).')
    msg = (f'deepvit_mm did not evaluate the config text stored in checkpoint {path!r} '
           f'({where}): it is not plain data ({problem}). {remedy} ' + _trust_hint(path))
    return f'raise RuntimeError({msg!r})\n'


def _neutralise_config_text(obj: dict, path: str) -> None:
    for place in _CONFIG_TEXT_PLACES:
        holder = obj
        for key in place[:-1]:
            holder = holder.get(key) if isinstance(holder, Mapping) else None
        if not isinstance(holder, dict) or place[-1] not in holder:
            continue
        problem = config_text_problem(holder[place[-1]])
        if problem:
            where = "checkpoint['" + "']['".join(place) + "']"
            holder[place[-1]] = _refusing_config(where, problem, path,
                                                  resume=place == ('meta', 'config'))


# --------------------------------------------------------------------------------------------
# state dicts
# --------------------------------------------------------------------------------------------
class _StateDict(dict):
    """A flat name -> tensor dict that remembers keys dropped while unwrapping it (DINO's
    projection head), so that the load report can list them."""
    dropped: List[str]


# containers of the model's weights, in the order they are looked for; DINO's `teacher` (the
# model DINO evaluates) before its `student`
_CONTAINERS = ('state_dict', 'model', 'module', 'model_ema', 'teacher', 'student')


def extract_state_dict(obj, checkpoint_key: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """Unwrap the usual containers and prefixes into a flat name -> tensor dict.

    ``{'state_dict': ...}`` (mmengine/mmdet/mmseg), ``{'model': ...}`` (official XCiT/CaiT/DeiT
    releases), ``{'module': ...}``, ``{'teacher': ..., 'student': ...}`` (DINO training
    checkpoints: the teacher unless ``checkpoint_key='student'``; their ``backbone.`` prefix is
    removed and the projection ``head.*`` dropped); ``module.`` prefixes (DDP) are stripped.

    Args:
        obj: What ``read_checkpoint`` returned.
        checkpoint_key (str, optional): The container to take, e.g. ``'student'``.
    """
    if not isinstance(obj, Mapping):
        raise CheckpointError(f'expected a dict of tensors in the checkpoint, got {type(obj).__name__}')
    if checkpoint_key is not None:
        if not isinstance(obj.get(checkpoint_key), Mapping):
            raise CheckpointError(
                f'checkpoint_key={checkpoint_key!r}: the checkpoint has no such part (it has: '
                f'{", ".join(k for k in obj if isinstance(obj[k], Mapping)) or "no dicts"}).')
        key = checkpoint_key
    else:
        key = next((k for k in _CONTAINERS if isinstance(obj.get(k), Mapping)), None)
    if key is not None:
        obj = obj[key]
    sd = _StateDict((k[7:] if k.startswith('module.') else k, v) for k, v in obj.items()
                    if torch.is_tensor(v))
    sd.dropped = []
    if key in ('teacher', 'student') and any(k.startswith('backbone.') for k in sd):
        sd.dropped = sorted(k for k in sd if not k.startswith('backbone.'))
        kept = {k[9:]: v for k, v in sd.items() if k.startswith('backbone.')}
        sd.clear()
        sd.update(kept)
    if not sd:
        raise CheckpointError('the checkpoint holds no tensors (keys: '
                              f'{", ".join(list(obj)[:10])}); it is not a model checkpoint.')
    return sd


# --------------------------------------------------------------------------------------------
# the report
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
    """What ``load_weights`` did, tensor by tensor."""
    source: str = ''
    loaded: List[str] = field(default_factory=list)
    resized: List[Tuple[str, tuple, tuple]] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)
    skipped: List[Tuple[str, str]] = field(default_factory=list)
    left_at_init: List[str] = field(default_factory=list)

    def format(self) -> str:
        lines = [f'weights from {self.source}: loaded {len(self.loaded)} tensors']
        if self.resized:
            lines.append('  resized: ' + ', '.join(f'{k} {tuple(a)} -> {tuple(b)}'
                                                   for k, a, b in self.resized))
        if self.dropped:
            lines.append(f'  dropped on purpose ({len(self.dropped)}): {_summarize(self.dropped)}')
        if self.skipped:
            lines.append(f'  skipped ({len(self.skipped)}): '
                         + '; '.join(f'{k}: {why}' for k, why in self.skipped[:8])
                         + (' ...' if len(self.skipped) > 8 else ''))
        if self.left_at_init:
            lines.append(f'  left at init ({len(self.left_at_init)}): '
                         f'{_summarize(self.left_at_init)}')
        return '\n'.join(lines)


# --------------------------------------------------------------------------------------------
# the matcher
# --------------------------------------------------------------------------------------------
def _matches(key: str, patterns: Sequence[str]) -> bool:
    return any(re.match(p, key) for p in patterns)


def _match_backbone(backbone: nn.Module, state_dict: Mapping[str, torch.Tensor], prefix: str,
                    source: str, report: LoadReport) -> Dict[str, torch.Tensor]:
    """The part of a checkpoint meant for a deepvit_mm backbone, converted to its keys; refuses
    the checkpoint unless every trunk tensor fits. Returns ``prefix``-ed tensors to load."""
    sd = backbone.convert_state_dict(dict(state_dict))
    target = backbone.state_dict()
    drop, init_ok = backbone._drop_patterns(), backbone._init_ok_patterns()
    out, mismatched, unexpected = {}, [], []
    for k, v in sd.items():
        if k in target:
            if v.shape == target[k].shape:
                out[k] = v
                continue
            resized = backbone._resize_tensor(k, v, target[k])
            if resized is not None:
                out[k] = resized
                report.resized.append((prefix + k, tuple(v.shape), tuple(resized.shape)))
                continue
            mismatched.append(f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(target[k].shape)}')
        elif _matches(k, drop):
            report.dropped.append(prefix + k)
        else:
            unexpected.append(k)
    missing = [k for k in target if k not in sd and not _matches(k, init_ok)]
    if mismatched or unexpected or missing:
        parts = []
        if mismatched:
            parts.append(f'{len(mismatched)} tensors of another shape: ' + '; '.join(mismatched[:8])
                         + (' ...' if len(mismatched) > 8 else ''))
        if unexpected:
            parts.append(f'{len(unexpected)} tensors the model does not have: {_summarize(unexpected)}')
        if missing:
            parts.append(f'{len(missing)} model tensors missing from it: {_summarize(missing)}')
        hint = backbone.describe_state_dict(sd)
        name = f'{type(backbone).__name__}({backbone.arch})'
        # what the checkpoint is comes first: the tensor lists that follow can be long
        raise CheckpointError(
            f'{source} does not fit {name}' + (f'. {hint}' if hint else '')
            + '. Use a checkpoint of the same architecture, or set `arch` to match it. '
            + ' | '.join(parts))
    return {prefix + k: v for k, v in out.items()}


def _columnar_backbones(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    from .backbones.columnar import ColumnarBackbone
    return [(name + '.' if name else '', m) for name, m in model.named_modules()
            if isinstance(m, ColumnarBackbone)]


_REQUIRE_COMPLETE = []


@contextlib.contextmanager
def require_complete_model() -> Iterator[None]:
    """Inside the block, ``load_weights`` refuses a checkpoint that leaves any of the model at
    init (``tools/test.py`` evaluates trained models: a backbone-only checkpoint would score 0)."""
    _REQUIRE_COMPLETE.append(True)
    try:
        yield
    finally:
        _REQUIRE_COMPLETE.pop()


def load_weights(model: nn.Module, checkpoint: Mapping, *, source: str = 'checkpoint',
                 strict: bool = False, checkpoint_key: Optional[str] = None,
                 log: bool = True) -> LoadReport:
    """Load a checkpoint into ``model`` (a backbone, or a detector/segmentor holding one).

    Args:
        model (nn.Module): Receives the weights.
        checkpoint (Mapping): What ``read_checkpoint`` returned, or a state dict.
        source (str): Where the weights came from, for messages. Default: ``'checkpoint'``.
        strict (bool): Refuse unless every tensor of the model is loaded and every tensor of the
            checkpoint is used or dropped on purpose. Default: False.
        checkpoint_key (str, optional): The part of the checkpoint to take (``'student'`` of a
            DINO checkpoint). Default: the first of ``state_dict``, ``model``, ``module``,
            ``model_ema``, ``teacher``, ``student`` present.
        log (bool): Log the report (one message). Default: True.

    Returns:
        LoadReport: loaded / resized / dropped on purpose / skipped / left at init.

    Raises:
        CheckpointError: The backbone part does not fit (another architecture or family),
            nothing of the model would load, a weight is not finite, or ``strict`` and something
            did not load. Nothing is copied in that case.
    """
    if all(torch.is_tensor(v) for v in checkpoint.values()) and checkpoint_key is None:
        sd = dict(checkpoint)
        sd = {k[7:] if k.startswith('module.') else k: v for k, v in sd.items()}
        dropped_outside: List[str] = []
    else:
        extracted = extract_state_dict(checkpoint, checkpoint_key)
        sd, dropped_outside = dict(extracted), list(extracted.dropped)
    target = model.state_dict()
    report = LoadReport(source=f'{source} into {type(model).__name__}')
    report.dropped.extend(dropped_outside)
    new_sd: Dict[str, torch.Tensor] = {}
    rest = dict(sd)
    init_ok: List[str] = []
    backbones = _columnar_backbones(model)
    for prefix, backbone in backbones:
        part = {k[len(prefix):]: rest.pop(k) for k in list(rest) if k.startswith(prefix)}
        if not part and prefix and not any(k in target for k in rest) and set(
                backbone.convert_state_dict(dict(rest))) & set(backbone.state_dict()):
            # a backbone (classification, timm, DINO) checkpoint given for a whole model
            part, rest = rest, {}
        if part:
            new_sd.update(_match_backbone(backbone, part, prefix, source, report))
        init_ok += [prefix + p.lstrip('^') for p in backbone._init_ok_patterns()]
    for k, v in rest.items():
        if k not in target:
            report.skipped.append((k, 'not in the model'))
        elif v.shape != target[k].shape:
            report.skipped.append(
                (k, f'checkpoint {tuple(v.shape)} vs model {tuple(target[k].shape)}'))
        else:
            new_sd[k] = v
    report.loaded = sorted(new_sd)
    report.left_at_init = [k for k in target if k not in new_sd]
    if not new_sd:
        raise CheckpointError(
            f'{source}: nothing of {type(model).__name__} would load from it (its tensors: '
            f'{_summarize(sd) or "none"}). It is a checkpoint of another model.')
    bad = [k for k, v in new_sd.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(
            f'{source}: {len(bad)} tensors hold NaN or infinite values: {", ".join(bad[:8])}'
            f'{" ..." if len(bad) > 8 else ""}. The run that wrote it diverged; load an earlier '
            'checkpoint of that run.')
    left = [k for k in report.left_at_init if not k.endswith('num_batches_tracked')]
    if strict and (report.skipped or left):
        raise CheckpointError(f'{source} does not match {type(model).__name__} exactly '
                              f'(strict=True):\n{report.format()}')
    if _REQUIRE_COMPLETE and left:
        raise CheckpointError(
            f'{source} has no weights for {len(left)} tensors of {type(model).__name__}: '
            f'{_summarize(left)}. Evaluating needs the checkpoint of a trained model (this one '
            'looks like ' + ('a backbone checkpoint: train with it as the backbone\'s init_cfg '
                             'or load_from first)' if all(
                                 any(k.startswith(p) for p, _ in backbones)
                                 for k in report.loaded) else 'a partial one)') + '.')
    model.load_state_dict(new_sd, strict=False)
    if log:
        from mmengine.logging import print_log
        print_log(report.format(), logger='current',
                  level=logging.WARNING if report.skipped else logging.INFO)
    return report


# --------------------------------------------------------------------------------------------
# mmengine integration
# --------------------------------------------------------------------------------------------
_LAST_READ: List[str] = ['checkpoint']  # the file mmengine read last, to name it in the report


def _mmengine_read(filename: str, map_location=None) -> dict:
    obj = read_checkpoint(filename, map_location=map_location or 'cpu')
    _LAST_READ[0] = repr(filename)
    if isinstance(obj, Mapping) and obj and all(torch.is_tensor(v) for v in obj.values()) \
            and str(filename).endswith('.safetensors'):
        obj = {'state_dict': dict(obj)}
    return obj


def _mmengine_read_url(filename: str, map_location=None, model_dir=None, **kwargs) -> dict:
    return _mmengine_read(filename, map_location)


def _unwrap(module: nn.Module) -> nn.Module:
    from mmengine.model import BaseTTAModel, is_model_wrapper
    while is_model_wrapper(module) or isinstance(module, BaseTTAModel):
        module = module.module
    return module


def install_mmengine_loader() -> None:
    """Route mmengine's checkpoint reading and, for models holding a deepvit_mm backbone, its
    ``load_state_dict`` through this module (see the module docstring). Idempotent."""
    from mmengine.runner import checkpoint as mm_ckpt
    mm_ckpt.CheckpointLoader.register_scheme(prefixes='', force=True)(_mmengine_read)
    mm_ckpt.CheckpointLoader.register_scheme(prefixes=('http://', 'https://'),
                                             force=True)(_mmengine_read_url)
    original = mm_ckpt.load_state_dict
    if getattr(original, '_deepvit_mm', False):
        return

    def load_state_dict(module, state_dict, strict=False, logger=None):
        model = _unwrap(module)
        if not _columnar_backbones(model):
            return original(module, state_dict, strict, logger)
        load_weights(model, state_dict, source=_LAST_READ[0], strict=strict)

    load_state_dict._deepvit_mm = True
    load_state_dict.__doc__ = original.__doc__
    # reason: every mmengine path (Runner.load_checkpoint/resume, load_checkpoint, the inferencers'
    # _load_checkpoint_to_model) calls this module-level function by its global name
    mm_ckpt.load_state_dict = load_state_dict


# --------------------------------------------------------------------------------------------
# finding a checkpoint to resume from
# --------------------------------------------------------------------------------------------
def is_readable_checkpoint(path: str) -> bool:
    """The file exists and is complete: a torch zip or safetensors file whose structure checks,
    or a legacy (non-zip) torch file that reads safely (a killed writer leaves a truncated one)."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return False
    try:
        if _is_safetensors(path):
            from safetensors import safe_open
            with safe_open(path, 'pt') as f:
                f.keys()
            return True
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                return z.testzip() is None
        read_checkpoint(path)  # legacy pickle format: no cheaper structural check
        return True
    except Exception:
        return False


_CKPT_NAME = re.compile(r'(iter|epoch)_(\d+)\.(pth|pt|safetensors)')


def find_resumable_checkpoint(work_dir: str) -> Optional[str]:
    """The newest complete checkpoint of a run, for ``--resume`` without a path.

    Trusts ``work_dir/last_checkpoint`` when it names a readable file; otherwise (a run killed
    while saving) falls back to the newest readable ``iter_*``/``epoch_*`` checkpoint (any format
    ``read_checkpoint`` reads) and says which one and why. Returns None, with a warning, when the
    work dir has none.
    """
    from mmengine.logging import print_log
    last = os.path.join(work_dir, 'last_checkpoint')
    named = None
    if os.path.isfile(last):
        with open(last) as f:
            named = f.read().strip()
        if named and is_readable_checkpoint(named):
            return named
    candidates = []
    for name in os.listdir(work_dir) if os.path.isdir(work_dir) else []:
        m = _CKPT_NAME.fullmatch(name)
        if m:
            candidates.append((int(m.group(2)), os.path.join(work_dir, name)))
    for _, path in sorted(candidates, reverse=True):
        if is_readable_checkpoint(path):
            if named:
                print_log(f'last_checkpoint names {named!r}, which is missing or incomplete (a run '
                          f'killed while saving?); resuming from {path!r} instead.',
                          logger='current', level=logging.WARNING)
            return path
        print_log(f'skipping incomplete checkpoint {path!r}', logger='current',
                  level=logging.WARNING)
    print_log(f'--resume: no complete checkpoint in {work_dir!r}; training starts from '
              'iteration 0.', logger='current', level=logging.WARNING)
    return None
