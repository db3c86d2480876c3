"""One matcher for every path that loads weights, and one report of what it did.

The paths: a backbone's ``init_cfg``, ``load_from``, ``--resume``, ``tools/test.py``, mmengine's
``load_checkpoint`` (mmdet's ``init_detector``, mmseg's ``init_model``) and the inferencers. The
part of a checkpoint that belongs to a ``WeightsTarget`` (a deepvit_mm backbone) is converted from
any supported layout (official XCiT/CaiT releases, timm, DINO, official XCiT detectors/segmentors,
ours) and must fit it, or the whole checkpoint is refused with the tensor names; the rest of the
model loads what fits and reports what does not (another class count: ``skipped``). Non-finite
weights are refused by name. One report says what was loaded, resized, dropped on purpose,
skipped and left at init.
"""
import contextlib
import contextvars
import logging
import re
from dataclasses import dataclass, field
from typing import (
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    runtime_checkable,
)

import torch
import torch.nn as nn

from .errors import CheckpointError

__all__ = ['WeightsTarget', 'extract_state_dict', 'LoadReport', 'plan_load', 'load_weights',
           'require_complete_model']


@runtime_checkable
class WeightsTarget(Protocol):
    """What the matcher asks of a backbone it loads (deepvit_mm's ``ColumnarBackbone``
    implements it); the loader never imports the backbones.

    * ``convert_state_dict(sd)``: any supported checkpoint layout -> the module's own keys.
    * ``describe_state_dict(sd)``: what a checkpoint that does not fit looks like, for the message.
    * ``dropped_key_patterns()``: regexes of converted keys dropped on purpose (a classifier head).
    * ``init_ok_key_patterns()``: regexes of module keys that may stay at init.
    * ``resize_weight(key, value, target)``: ``value`` resized to ``target``'s shape (a position
      embedding at another grid), or None when it cannot be.
    """

    def convert_state_dict(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        ...

    def describe_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> str:
        ...

    def dropped_key_patterns(self) -> List[str]:
        ...

    def init_ok_key_patterns(self) -> List[str]:
        ...

    def resize_weight(self, key: str, value: torch.Tensor,
                      target: torch.Tensor) -> Optional[torch.Tensor]:
        ...


# --------------------------------------------------------------------------------------------
# state dicts
# --------------------------------------------------------------------------------------------
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
    return _unwrap(obj, checkpoint_key)[0]


def _unwrap(obj, checkpoint_key: Optional[str]) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """``extract_state_dict``'s state dict, and the keys it dropped on purpose (DINO's
    projection head), for the report."""
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
    sd = {(k[7:] if k.startswith('module.') else k): v for k, v in obj.items()
          if torch.is_tensor(v)}
    dropped = []
    if key in ('teacher', 'student') and any(k.startswith('backbone.') for k in sd):
        dropped = sorted(k for k in sd if not k.startswith('backbone.'))
        sd = {k[9:]: v for k, v in sd.items() if k.startswith('backbone.')}
    if not sd:
        raise CheckpointError('the checkpoint holds no tensors (keys: '
                              f'{", ".join(list(obj)[:10])}); it is not a model checkpoint.')
    return sd, dropped


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
    drop, init_ok = backbone.dropped_key_patterns(), backbone.init_ok_key_patterns()
    out, mismatched, unexpected = {}, [], []
    for k, v in sd.items():
        if k in target:
            if v.shape == target[k].shape:
                out[k] = v
                continue
            resized = backbone.resize_weight(k, v, target[k])
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
        name = f'{type(backbone).__name__}({getattr(backbone, "arch", "")})'
        # what the checkpoint is comes first: the tensor lists that follow can be long
        raise CheckpointError(
            f'{source} does not fit {name}' + (f'. {hint}' if hint else '')
            + '. Use a checkpoint of the same architecture, or set `arch` to match it. '
            + ' | '.join(parts))
    return {prefix + k: v for k, v in out.items()}


def weights_targets(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``(prefix, module)`` of every module of ``model`` that takes its weights through the
    matcher (``WeightsTarget``: every deepvit_mm backbone)."""
    return [(name + '.' if name else '', m) for name, m in model.named_modules()
            if isinstance(m, WeightsTarget)]


# set by the enclosing `with require_complete_model()` block of this thread/task
_REQUIRE_COMPLETE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    'deepvit_mm_require_complete_model', default=False)


@contextlib.contextmanager
def require_complete_model() -> Iterator[None]:
    """Inside the block, ``load_weights`` refuses a checkpoint that leaves any of the model at
    init, as with ``require_complete=True``: for the loads mmengine makes, which take no such
    argument (``tools/test.py`` evaluates trained models: a backbone-only checkpoint would score
    0)."""
    token = _REQUIRE_COMPLETE.set(True)
    try:
        yield
    finally:
        _REQUIRE_COMPLETE.reset(token)


@dataclass
class LoadPlan:
    """What loading a checkpoint into a model will do, computed before anything is copied:
    ``tensors`` (the model's key -> the tensor it gets) and the ``report``."""
    tensors: Dict[str, torch.Tensor]
    report: LoadReport


def _route(model: nn.Module, sd: Dict[str, torch.Tensor], source: str,
           report: LoadReport) -> Dict[str, torch.Tensor]:
    """The tensors of ``sd`` each of the model's keys gets: a backbone's part converted and
    matched (``_match_backbone``), the rest by name where the shapes agree (else ``skipped``)."""
    target = model.state_dict()
    tensors: Dict[str, torch.Tensor] = {}
    rest = dict(sd)
    for prefix, backbone in weights_targets(model):
        part = {k[len(prefix):]: rest.pop(k) for k in list(rest) if k.startswith(prefix)}
        if not part and prefix and not any(k in target for k in rest) and set(
                backbone.convert_state_dict(dict(rest))) & set(backbone.state_dict()):
            # a backbone (classification, timm, DINO) checkpoint given for a whole model
            part, rest = rest, {}
        if part:
            tensors.update(_match_backbone(backbone, part, prefix, source, report))
    for k, v in rest.items():
        if k not in target:
            report.skipped.append((k, 'not in the model'))
        elif v.shape != target[k].shape:
            report.skipped.append(
                (k, f'checkpoint {tuple(v.shape)} vs model {tuple(target[k].shape)}'))
        else:
            tensors[k] = v
    report.loaded = sorted(tensors)
    report.left_at_init = [k for k in target if k not in tensors]
    return tensors


def _check_plan(plan: LoadPlan, model: nn.Module, source: str, sd: Mapping[str, torch.Tensor],
                strict: bool, require_complete: bool) -> None:
    """Refuse a plan that loads nothing, a non-finite weight, or (``strict``,
    ``require_complete``) less than the whole model."""
    report, model_name = plan.report, type(model).__name__
    if not plan.tensors:
        raise CheckpointError(
            f'{source}: nothing of {model_name} would load from it (its tensors: '
            f'{_summarize(sd) or "none"}). It is a checkpoint of another model.')
    bad = [k for k, v in plan.tensors.items()
           if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(
            f'{source}: {len(bad)} tensors hold NaN or infinite values: {", ".join(bad[:8])}'
            f'{" ..." if len(bad) > 8 else ""}. The run that wrote it diverged; load an earlier '
            'checkpoint of that run.')
    left = [k for k in report.left_at_init if not k.endswith('num_batches_tracked')]
    if strict and (report.skipped or left):
        raise CheckpointError(f'{source} does not match {model_name} exactly '
                              f'(strict=True):\n{report.format()}')
    if require_complete and left:
        backbones = weights_targets(model)
        backbone_only = all(any(k.startswith(p) for p, _ in backbones) for k in report.loaded)
        raise CheckpointError(
            f'{source} has no weights for {len(left)} tensors of {model_name}: '
            f'{_summarize(left)}. Evaluating needs the checkpoint of a trained model (this one '
            'looks like ' + ('a backbone checkpoint: train with it as the backbone\'s init_cfg '
                             'or load_from first)' if backbone_only else 'a partial one)') + '.')


def plan_load(model: nn.Module, checkpoint: Mapping, *, source: str = 'checkpoint',
              strict: bool = False, checkpoint_key: Optional[str] = None,
              require_complete: Optional[bool] = None) -> LoadPlan:
    """What ``load_weights`` would load and report, copying nothing; refuses as it does (same
    arguments)."""
    if require_complete is None:
        require_complete = _REQUIRE_COMPLETE.get()
    sd, dropped = _unwrap(checkpoint, checkpoint_key)
    report = LoadReport(source=f'{source} into {type(model).__name__}', dropped=list(dropped))
    plan = LoadPlan(tensors=_route(model, sd, source, report), report=report)
    _check_plan(plan, model, source, sd, strict, require_complete)
    return plan


def load_weights(model: nn.Module, checkpoint: Mapping, *, source: str = 'checkpoint',
                 strict: bool = False, checkpoint_key: Optional[str] = None,
                 require_complete: Optional[bool] = None, log: bool = True) -> LoadReport:
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
        require_complete (bool, optional): Refuse a checkpoint that leaves any of the model at
            init (a trained model to evaluate or export). Default: inside a
            ``require_complete_model()`` block, else False.
        log (bool): Log the report (one message). Default: True.

    Returns:
        LoadReport: loaded / resized / dropped on purpose / skipped / left at init.

    Raises:
        CheckpointError: The backbone part does not fit (another architecture or family),
            nothing of the model would load, a weight is not finite, or ``strict`` and something
            did not load, or ``require_complete`` and some of the model would stay at init.
            Nothing is copied in that case.
    """
    plan = plan_load(model, checkpoint, source=source, strict=strict,
                     checkpoint_key=checkpoint_key, require_complete=require_complete)
    model.load_state_dict(plan.tensors, strict=False)
    report = plan.report
    if log:
        from mmengine.logging import print_log
        print_log(report.format(), logger='current',
                  level=logging.WARNING if report.skipped else logging.INFO)
    return report
