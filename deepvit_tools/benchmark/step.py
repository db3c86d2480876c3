"""Where a training step's time goes: a detector's or segmentor's step split into its parts.

``profile_train_step`` runs the step a part at a time: each part's forward takes its inputs as
leaves (``detach().requires_grad_()``) and its backward is run with the gradients the parts after
it produced, so that each part's forward and backward are timed alone while the gradients that
reach every parameter are those of ``model.train_step`` (losses are summed: each head's
backward can run on its own). The same run times whole ``model.train_step`` calls, interleaved
with the split ones, so a report shows how far the split's sum is from a real step.

Parts: ``data`` (the data preprocessor), ``backbone``, ``neck``, then a detector's ``rpn`` and
``roi`` heads (two-stage), ``head`` (one-stage), or a segmentor's ``decode`` and ``aux`` heads;
``optimizer`` (gradient clipping, the update and ``zero_grad``).
"""
import copy
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .batches import synthetic_data
from .models import build_from_config, load_config, num_classes_of

__all__ = ['profile_train_step', 'split_backward', 'step_markdown']


def _leaves(xs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [x.detach().requires_grad_() for x in xs]


def _backward(outs: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor]) -> None:
    pairs = [(o, leaf.grad) for o, leaf in zip(outs, leaves) if leaf.grad is not None]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


class _Clock:
    """Seconds per ``(part, 'fwd'|'bwd'|'')`` for one step."""

    def __init__(self):
        self.times: Dict[Tuple[str, str], float] = {}

    def __call__(self, part: str, phase: str, fn: Callable[[], object]):
        t0 = time.perf_counter()
        out = fn()
        self.times[(part, phase)] = self.times.get((part, phase), 0.0) + time.perf_counter() - t0
        return out


def _loss(model: nn.Module, losses: dict) -> torch.Tensor:
    return model.parse_losses(losses)[0]


def _heads_det(model, feats, samples, clock: _Clock) -> None:
    if getattr(model, 'with_rpn', False):
        cfg = model.train_cfg.get('rpn_proposal', model.test_cfg.rpn)
        rpn_samples = copy.deepcopy(samples)
        for s in rpn_samples:  # as TwoStageDetector.loss: the RPN is class-agnostic
            s.gt_instances.labels = torch.zeros_like(s.gt_instances.labels)
        rpn_losses, proposals = clock('rpn', 'fwd', lambda: model.rpn_head.loss_and_predict(
            feats, rpn_samples, proposal_cfg=cfg))
        clock('rpn', 'bwd', lambda: _loss(model, rpn_losses).backward())
        for p in proposals:  # no gradient flows through proposals in a real step either
            p.bboxes = p.bboxes.detach()
        roi_losses = clock('roi', 'fwd', lambda: model.roi_head.loss(feats, proposals, samples))
        clock('roi', 'bwd', lambda: _loss(model, roi_losses).backward())
    else:
        losses = clock('head', 'fwd', lambda: model.bbox_head.loss(feats, samples))
        clock('head', 'bwd', lambda: _loss(model, losses).backward())


def _heads_seg(model, feats, samples, clock: _Clock) -> None:
    heads = [('decode', model.decode_head)]
    if getattr(model, 'with_auxiliary_head', False):
        aux = model.auxiliary_head
        heads += [(f'aux{i}', h) for i, h in enumerate(aux)] if isinstance(aux, nn.ModuleList) \
            else [('aux', aux)]
    for name, head in heads:
        losses = clock(name, 'fwd', lambda h=head: h.loss(feats, samples, model.train_cfg))
        clock(name, 'bwd', lambda ls=losses: _loss(model, ls).backward())


def split_backward(model: nn.Module, data: dict, task: str,
                   clock: Optional[Callable] = None) -> Dict[Tuple[str, str], float]:
    """The forward and backward of a training step, a part at a time: the parameters' ``.grad``
    end up as ``model.train_step``'s (before its optimizer step) would leave them. Returns the
    seconds per ``(part, phase)``."""
    clock = clock or _Clock()
    batch = clock('data', '', lambda: model.data_preprocessor(data, True))
    inputs, samples = batch['inputs'], batch['data_samples']
    feats = clock('backbone', 'fwd', lambda: model.backbone(inputs))
    feats_in = _leaves(feats)
    outs, outs_in = feats_in, feats_in
    if getattr(model, 'with_neck', False):
        outs = clock('neck', 'fwd', lambda: model.neck(feats_in))
        outs_in = _leaves(outs)
    (_heads_det if task == 'det' else _heads_seg)(model, outs_in, samples, clock)
    if outs is not feats_in:
        clock('neck', 'bwd', lambda: _backward(outs, outs_in))
    clock('backbone', 'bwd', lambda: _backward(feats, feats_in))
    return clock.times


def _split_step(model, data, optim_wrapper, task: str) -> Dict[Tuple[str, str], float]:
    clock = _Clock()
    split_backward(model, data, task, clock)
    clock('optimizer', '', lambda: (optim_wrapper.step(), optim_wrapper.zero_grad()))
    return clock.times


def profile_train_step(config: str, size: Tuple[int, int] = (800, 1344), batch_size: int = 1,
                       num_objects: int = 10, steps: int = 3, warmup: int = 1,
                       cfg_options: Optional[dict] = None, seed: int = 0) -> dict:
    """Time a config's training step by part on CPU, next to whole ``model.train_step`` calls.

    Steps alternate (split, whole, split, whole, ...) after ``warmup`` of each; the median of
    each is reported. The model trains on the same synthetic batch throughout (its weights move:
    the cost of a step does not depend on them).

    Args:
        config (str): An mmdet or mmseg config with a deepvit_mm backbone.
        size (tuple[int, int]): Image ``(H, W)``. Default: ``(800, 1344)``.
        batch_size (int): Images in the batch. Default: 1.
        num_objects (int): Ground-truth instances per image (detectors). Default: 10.
        steps (int): Timed steps of each kind. Default: 3.
        warmup (int): Untimed steps of each kind first. Default: 1.
        cfg_options (dict, optional): Config overrides.
        seed (int): Seed of the weights and the batch. Default: 0.

    Returns:
        dict: ``parts`` (``{part: {'fwd', 'bwd', 'total'}}`` median seconds), ``split_sum``,
        ``whole_step`` (median seconds of ``model.train_step``), ``config``, ``size``,
        ``batch_size``, ``threads``.
    """
    from mmengine.optim import build_optim_wrapper
    cfg = load_config(config, cfg_options)
    torch.manual_seed(seed)
    model, task = build_from_config(cfg)
    model.train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    data = synthetic_data(task, tuple(size), batch_size, num_classes_of(model, task),
                          num_objects, seed)
    split: List[Dict[Tuple[str, str], float]] = []
    whole: List[float] = []
    for i in range(warmup + steps):
        times = _split_step(model, data, optim_wrapper, task)
        t0 = time.perf_counter()
        model.train_step(data, optim_wrapper)
        if i >= warmup:
            split.append(times)
            whole.append(time.perf_counter() - t0)
    keys = list(split[0])
    med = {k: statistics.median(t.get(k, 0.0) for t in split) for k in keys}
    parts: Dict[str, Dict[str, float]] = {}
    for (part, phase), sec in med.items():
        entry = parts.setdefault(part, {})
        entry[phase or 'total'] = sec
    for entry in parts.values():
        entry.setdefault('total', entry.get('fwd', 0.0) + entry.get('bwd', 0.0))
    return dict(config=config, size=list(size), batch_size=batch_size, task=task,
                parts=parts, split_sum=sum(e['total'] for e in parts.values()),
                whole_step=statistics.median(whole), steps=steps,
                threads=torch.get_num_threads())


def step_markdown(result: dict) -> List[str]:
    """A markdown table of ``profile_train_step``'s result: seconds and share of the split sum."""
    total = result['split_sum']

    def s(v: Optional[float]) -> str:
        return '' if v is None else f'{v:.3f}'

    lines = ['| part | forward (s) | backward (s) | total (s) | share |',
             '|---|---:|---:|---:|---:|']
    for part, e in result['parts'].items():
        lines.append(f"| {part} | {s(e.get('fwd'))} | {s(e.get('bwd'))} | {e['total']:.3f} | "
                     f"{100 * e['total'] / total:.0f} % |")
    lines.append(f'| sum of the parts | | | {total:.3f} | |')
    lines.append(f"| `model.train_step`, same run | | | {result['whole_step']:.3f} | |")
    return lines
