"""deepvit_mm's loading inside mmengine, installed by ``import deepvit_mm``.

``install_mmengine_loader``: mmengine's checkpoint reader for local files and ``http(s)://`` URLs
(and hub names, which reach it as paths) becomes ``read_checkpoint`` (for every model: that only
adds the refusal of code and of corrupted files), and mmengine's ``load_state_dict`` hands models
that contain a deepvit_mm backbone to ``load_weights``; other models are loaded by mmengine as
before. Nothing else in mmengine (file I/O of other files, other models' loading) changes.

How, in mmengine 0.10.3 and 0.10.7 (the supported 0.10.x): every path that loads a checkpoint
into a model (``Runner.load_checkpoint``/``resume``, ``load_checkpoint``, the inferencers'
``_load_checkpoint_to_model``) calls the module-level ``mmengine.runner.checkpoint.
load_state_dict`` by its global name, which is replaced by one that offers the model to
``load_weights`` first. The name of the file a state dict was read from travels with it to there
on its ``_metadata`` (torch's per-module state-dict metadata), which ``_load_checkpoint_to_model``
carries over when it renames the keys.

``find_resumable_checkpoint``: the newest complete checkpoint of a run, for ``--resume``.
"""
import logging
import os
import re
from collections import OrderedDict
from typing import Callable, Mapping, Optional

import torch
import torch.nn as nn

from ..utils import unwrap_model
from .matching import load_weights, weights_targets
from .reading import is_readable_checkpoint, read_checkpoint

__all__ = ['install_mmengine_loader', 'find_resumable_checkpoint']

_MARK = '_deepvit_mm'
_SOURCE = '_deepvit_mm_source'


# --------------------------------------------------------------------------------------------
# mmengine's load_state_dict and the source of a state dict
# --------------------------------------------------------------------------------------------
def _route_load_state_dict(handler: Callable[..., bool]) -> None:
    """Make mmengine's ``load_state_dict(module, state_dict, strict, logger)`` call
    ``handler(module, state_dict, strict)`` first; where the handler returns False (not one of its
    models) mmengine's own runs. Installed once; later calls keep the first handler."""
    from mmengine.runner import checkpoint as mm_ckpt
    original = mm_ckpt.load_state_dict
    if getattr(original, _MARK, False):
        return

    def load_state_dict(module, state_dict, strict=False, logger=None):
        if not handler(module, state_dict, strict):
            return original(module, state_dict, strict, logger)

    setattr(load_state_dict, _MARK, True)
    load_state_dict.__doc__ = original.__doc__
    mm_ckpt.load_state_dict = load_state_dict


def _tag_source(checkpoint: Mapping, source: str) -> Mapping:
    """``checkpoint`` (as mmengine's reader returns it) with its state dict tagged as read from
    ``source``: the ``state_dict`` part, or the whole when it has none, as mmengine takes it."""
    if not isinstance(checkpoint, OrderedDict):
        checkpoint = OrderedDict(checkpoint)  # a plain dict takes no attributes
    part = checkpoint.get('state_dict', checkpoint)
    if isinstance(part, Mapping) and not isinstance(part, OrderedDict):
        part = checkpoint['state_dict'] = OrderedDict(part)
    if isinstance(part, OrderedDict):
        metadata = getattr(part, '_metadata', None)
        if metadata is None:
            metadata = part._metadata = OrderedDict()
        setattr(metadata, _SOURCE, source)
    return checkpoint


def _source_of(state_dict: Mapping) -> Optional[str]:
    """The source ``_tag_source`` gave ``state_dict``, or None."""
    return getattr(getattr(state_dict, '_metadata', None), _SOURCE, None)


# --------------------------------------------------------------------------------------------
# mmengine's reader
# --------------------------------------------------------------------------------------------


def _mmengine_read(filename: str, map_location=None) -> Mapping:
    obj = read_checkpoint(filename, map_location=map_location or 'cpu')
    if isinstance(obj, Mapping) and obj and all(torch.is_tensor(v) for v in obj.values()) \
            and str(filename).endswith('.safetensors'):
        obj = {'state_dict': dict(obj)}
    return _tag_source(obj, repr(filename)) if isinstance(obj, Mapping) else obj


def _mmengine_read_url(filename: str, map_location=None, model_dir=None, **kwargs) -> Mapping:
    return _mmengine_read(filename, map_location)


def _load_into_targets(module: nn.Module, state_dict: Mapping, strict: bool) -> bool:
    """``load_weights`` for a model holding a deepvit_mm backbone; False for any other model."""
    model = unwrap_model(module)
    if not weights_targets(model):
        return False
    load_weights(model, state_dict, source=_source_of(state_dict) or 'checkpoint', strict=strict)
    return True


def install_mmengine_loader() -> None:
    """Route mmengine's checkpoint reading and, for models holding a deepvit_mm backbone, its
    ``load_state_dict`` through this module (see the module docstring). Idempotent."""
    from mmengine.runner import checkpoint as mm_ckpt
    mm_ckpt.CheckpointLoader.register_scheme(prefixes='', force=True)(_mmengine_read)
    mm_ckpt.CheckpointLoader.register_scheme(prefixes=('http://', 'https://'),
                                             force=True)(_mmengine_read_url)
    _route_load_state_dict(_load_into_targets)


# --------------------------------------------------------------------------------------------
# finding a checkpoint to resume from
# --------------------------------------------------------------------------------------------
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
