"""Where a detector's or segmentor's training step spends its time, part by part (CPU).

``split_backward`` runs the step a part at a time: each part's forward takes its inputs as
leaves and its backward runs with the gradients the later parts produced, so each part is timed
alone while every parameter gets ``model.train_step``'s gradient. Parts: ``data``, ``backbone``,
``neck``, a detector's ``rpn`` and ``roi`` (or ``head``) or a segmentor's ``decode`` and ``aux``
heads, ``optimizer``. Whole ``train_step`` calls are timed interleaved, as the check on the sum.
Each part's floor (float32): its multiply-adds (``flops.WorkCounter``, one more split step) at
the GEMM rate of the backbone's MLP shape plus the bytes of its operators without FLOPs at the
streaming rate (``roofline.device_rates``, same run); the heads' smaller products run below that
rate, so it is a lower bound, not a target.
"""
import copy
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .batches import synthetic_data
from .flops import WorkCounter
from .models import build_from_config, load_config, num_classes_of
from .roofline import device_rates

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


class _WorkClock(_Clock):
    """Counts each part's work instead: multiply-adds and bytes moved without FLOPs."""

    def __init__(self):
        super().__init__()
        self.work: Dict[Tuple[str, str], Dict[str, float]] = {}

    def __call__(self, part: str, phase: str, fn: Callable[[], object]):
        with WorkCounter() as counter:
            out = fn()
        work = self.work.setdefault((part, phase), dict(macs=0, bytes=0))
        work['macs'] += counter.flops // 2
        work['bytes'] += sum(o.bytes for o in counter.ops if not o.flops)
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


def _split_step(model, data, optim_wrapper, task: str, clock: Optional[_Clock] = None) -> _Clock:
    """``split_backward``, then the optimizer, through ``clock`` (default: a timing one)."""
    clock = clock or _Clock()
    split_backward(model, data, task, clock)
    clock('optimizer', '', lambda: (optim_wrapper.step(), optim_wrapper.zero_grad()))
    return clock


def profile_train_step(config: str, size: Tuple[int, int] = (800, 1344), batch_size: int = 1,
                       num_objects: int = 10, steps: int = 3, warmup: int = 1,
                       cfg_options: Optional[dict] = None, seed: int = 0,
                       dtype: str = 'fp32') -> dict:
    """Time a config's training step by part on CPU: ``warmup`` then ``steps`` of each kind,
    split and whole ``model.train_step`` alternating, on one synthetic batch of ``batch_size``
    images of ``size`` with ``num_objects`` instances each (detectors).

    ``dtype``: ``'fp32'`` (``OptimWrapper``) or ``'bf16'`` (``CPUAmpOptimWrapper``'s bfloat16
    autocast, the split steps under it too), whatever the config's wrapper; the floors are
    float32's.

    Returns:
        dict: ``parts`` and ``floors`` (``{part: {'fwd', 'bwd', 'total'}}`` median seconds),
        ``split_sum``, ``floor_sum``, ``whole_step``, ``gemm_rate`` (multiply-adds/s),
        ``stream_rate`` (bytes/s) and the settings.
    """
    from mmengine.optim import build_optim_wrapper
    if dtype not in ('fp32', 'bf16'):
        raise ValueError(f"dtype {dtype!r}: use 'fp32' or 'bf16'")
    bf16 = dtype == 'bf16'
    cfg = load_config(config, cfg_options)
    cfg.optim_wrapper.pop('dtype', None)
    cfg.optim_wrapper.pop('loss_scale', None)
    cfg.optim_wrapper.type = 'CPUAmpOptimWrapper' if bf16 else 'OptimWrapper'
    if bf16:
        cfg.optim_wrapper.dtype = 'bfloat16'
    torch.manual_seed(seed)
    model, task = build_from_config(cfg)
    model.train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    data = synthetic_data(task, tuple(size), batch_size, num_classes_of(model, task),
                          num_objects, seed)
    split, whole = [], []
    for i in range(warmup + steps):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
            times = _split_step(model, data, optim_wrapper, task).times
        t0 = time.perf_counter()
        model.train_step(data, optim_wrapper)
        if i >= warmup:
            split.append(times)
            whole.append(time.perf_counter() - t0)
    med = {k: statistics.median(t.get(k, 0.0) for t in split) for k in split[0]}
    clock = _split_step(model, data, optim_wrapper, task, _WorkClock())
    inputs, p = model.data_preprocessor(data, True)['inputs'], model.backbone.patch_size
    tokens = inputs.shape[0] * -(-inputs.shape[-2] // p) * -(-inputs.shape[-1] // p)
    c = model.backbone.embed_dim
    rates = device_rates('cpu', mlp=(tokens, c))
    gemm_rate, stream_rate = rates[torch.float32] / 2, rates['copy']
    parts, floors = {}, {}
    for (part, phase), sec in med.items():
        work = clock.work.get((part, phase), dict(macs=0, bytes=0))
        parts.setdefault(part, {})[phase or 'total'] = sec
        floors.setdefault(part, {})[phase or 'total'] = \
            work['macs'] / gemm_rate + work['bytes'] / stream_rate
    for entry in (*parts.values(), *floors.values()):
        entry.setdefault('total', entry.get('fwd', 0.0) + entry.get('bwd', 0.0))
    return dict(config=config, size=list(size), batch_size=batch_size, task=task, dtype=dtype,
                parts=parts, split_sum=sum(e['total'] for e in parts.values()),
                floors=floors, floor_sum=sum(e['total'] for e in floors.values()),
                gemm_rate=gemm_rate, stream_rate=stream_rate,
                whole_step=statistics.median(whole), steps=steps,
                threads=torch.get_num_threads())


def step_markdown(result: dict) -> List[str]:
    """A markdown table of ``profile_train_step``'s result: seconds and share of the split sum."""
    total = result['split_sum']

    def s(v: Optional[float]) -> str:
        return '' if v is None else f'{v:.3f}'

    def ratio(seconds: float, floor: float) -> str:
        return f'{seconds / floor:.2f}' if floor > 0 else ''

    lines = ['| part | forward (s) | backward (s) | total (s) | share | floor (s) | / floor |',
             '|---|---:|---:|---:|---:|---:|---:|']
    for part, e in result['parts'].items():
        floor = result['floors'][part]['total']
        lines.append(f"| {part} | {s(e.get('fwd'))} | {s(e.get('bwd'))} | {e['total']:.3f} | "
                     f"{100 * e['total'] / total:.0f} % | {floor:.3f} | "
                     f"{ratio(e['total'], floor)} |")
    lines.append(f"| sum of the parts | | | {total:.3f} | | {result['floor_sum']:.3f} | "
                 f"{ratio(total, result['floor_sum'])} |")
    lines.append(f"| `model.train_step`, same run | | | {result['whole_step']:.3f} | | | |")
    lines.append('')
    lines.append(f"Floors: multiply-adds at {2 * result['gemm_rate'] / 1e9:.0f} GFLOP/s (float32 "
                 f"GEMM at the backbone's MLP shape), bytes at {result['stream_rate'] / 1e9:.1f} "
                 'GB/s (torch.add), both timed in this run.')
    return lines
