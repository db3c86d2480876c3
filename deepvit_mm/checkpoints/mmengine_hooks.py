"""deepvit_mm's loading inside mmengine, installed by ``import deepvit_mm``.

``install_mmengine_loader``: mmengine's checkpoint reader for local files and ``http(s)://`` URLs
(and hub names, which reach it as paths) becomes ``read_checkpoint`` (for every model: that only
adds the refusal of code and of corrupted files), and mmengine's ``load_state_dict`` hands models
that contain a deepvit_mm backbone to ``load_weights``; other models are loaded by mmengine as
before. Nothing else in mmengine (file I/O of other files, other models' loading) changes.

``find_resumable_checkpoint``: the newest complete checkpoint of a run, for ``--resume``.
"""
import logging
import os
import re
from typing import Mapping, Optional

import torch
import torch.nn as nn

from ..compat.mmengine import route_load_state_dict, source_of, tag_source
from ..utils import unwrap_model
from .matching import load_weights, weights_targets
from .reading import is_readable_checkpoint, read_checkpoint

__all__ = ['install_mmengine_loader', 'find_resumable_checkpoint']


def _mmengine_read(filename: str, map_location=None) -> Mapping:
    obj = read_checkpoint(filename, map_location=map_location or 'cpu')
    if isinstance(obj, Mapping) and obj and all(torch.is_tensor(v) for v in obj.values()) \
            and str(filename).endswith('.safetensors'):
        obj = {'state_dict': dict(obj)}
    return tag_source(obj, repr(filename)) if isinstance(obj, Mapping) else obj


def _mmengine_read_url(filename: str, map_location=None, model_dir=None, **kwargs) -> Mapping:
    return _mmengine_read(filename, map_location)


def _load_into_targets(module: nn.Module, state_dict: Mapping, strict: bool) -> bool:
    """``load_weights`` for a model holding a deepvit_mm backbone; False for any other model."""
    model = unwrap_model(module)
    if not weights_targets(model):
        return False
    load_weights(model, state_dict, source=source_of(state_dict) or 'checkpoint', strict=strict)
    return True


def install_mmengine_loader() -> None:
    """Route mmengine's checkpoint reading and, for models holding a deepvit_mm backbone, its
    ``load_state_dict`` through this module (see the module docstring). Idempotent."""
    from mmengine.runner import checkpoint as mm_ckpt
    mm_ckpt.CheckpointLoader.register_scheme(prefixes='', force=True)(_mmengine_read)
    mm_ckpt.CheckpointLoader.register_scheme(prefixes=('http://', 'https://'),
                                             force=True)(_mmengine_read_url)
    route_load_state_dict(_load_into_targets)


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
