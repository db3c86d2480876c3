"""The one count of work, per aten operator and per module, and a config's FLOPs with it.

``WorkCounter`` runs a call under ``torch.utils.flop_counter.FlopCounterMode`` (its formulas:
matrix products, convolutions, attention) and records per aten operator its FLOPs, the bytes it
reads and writes (its tensor inputs and outputs at their dtypes' sizes; views and allocations
move none) and its dtype. The FLOP tool, the metafiles (``config_flops``) and the roofline all
read it.

``config_flops`` counts as mmdet's/mmseg's ``get_flops`` and fvcore do: multiply-adds (FLOPs / 2)
of one inference forward, element-wise work not counted. Everything runs on the ``meta`` device;
the backbone as its architecture computes it (timm's forward); two-stage RoI heads as mmdet's
``get_flops`` runs them: the box head on ``max_per_img`` RoIs of the RPN's test config, the mask
head on the first 100, RoIAlign (an mmcv op, no meta kernel) replaced by an empty output of its
shape; mmseg's auxiliary head (a training loss) in the parameters only.
"""
import contextlib
import dataclasses
import os.path as osp
from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.utils import flop_counter as fc
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .models import load_config, reference_forward
from .report import fmt, size_str

__all__ = ['WorkCounter', 'config_flops', 'flops_markdown']

# COCO's 800 x 1333 padded to a multiple of 32 (mmdet's preprocessor), ADE20k's 512 x 512 crops
DEFAULT_SHAPES = {'det': (800, 1344), 'seg': (512, 512)}
_MASK_ROIS = 100  # mmdet's StandardRoIHead.forward (tensor mode) runs the mask head on 100 RoIs
# backbone counts (Part, meta outputs) by (backbone config, shape): two recipes share a backbone
_BACKBONES: Dict[tuple, Tuple['Part', object]] = {}
_NO_TRAFFIC = frozenset(('empty', 'empty_like', 'empty_strided', 'detach', 'lift_fresh',
                         'lift_fresh_copy', 'alias', 'set_', 'resize_', '_local_scalar_dense'))


class Op(NamedTuple):
    """One aten operator: FLOPs, bytes read and written, input dtype."""
    name: str
    flops: int
    bytes: int
    dtype: Optional[torch.dtype]


def _in_place(mats: int) -> Callable[..., int]:
    # FlopCounterMode has no formula for addmm_ / baddbmm_, which XCiT's fast path runs
    def formula(self_shape, a, b, *args, out_shape=None, **kwargs) -> int:
        return 2 * a[0] * a[1] * b[1] if mats == 2 else 2 * a[0] * a[1] * a[2] * b[2]
    return formula


def _conv_backward(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation,
                   transposed, _output_padding, groups, output_mask, out_shape=None, **kwargs) -> int:
    # torch's formula, with a grouped convolution's weight gradient divided by its groups (torch
    # counts it as one group: a depthwise convolution's, as LPI's, C times over)
    def t(shape):
        return [shape[1], shape[0]] + list(shape[2:])
    flops = 0
    if output_mask[0]:
        flops += fc.conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        a, b = (grad_out_shape, x_shape) if transposed else (x_shape, grad_out_shape)
        flops += fc.conv_flop_count(t(a), t(b), t(out_shape[1]), False) // groups
    return flops


def _tensor_bytes(t: torch.Tensor) -> int:
    logical = t.numel() * t.element_size()
    try:  # an expanded or strided view reads no more than its storage
        return min(logical, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # no storage (meta, functional tensors)
        return logical


class WorkCounter(TorchDispatchMode):
    """The work of the calls made inside it, seen below autograd and autocast (the backward's
    operators and autocast's casts are counted): ``ops`` (an ``Op`` per aten operator),
    ``flops`` and ``bytes`` (their sums) and ``module_macs()``.

    Args:
        root (nn.Module, optional): Whose modules ``module_macs`` keys (their forward hooks
            track which are running; torch 2.1's ``FlopCounterMode(mods=)`` breaks modules
            taking a tuple of maps, mmdet's FPN).
    """

    def __init__(self, root: Optional[nn.Module] = None) -> None:
        super().__init__()
        aten = torch.ops.aten
        self.counter = fc.FlopCounterMode(display=False, custom_mapping={
            aten.addmm_: _in_place(2), aten.baddbmm_: _in_place(3),
            aten.convolution_backward: _conv_backward})
        self.root, self.ops, self._flops, self._running = root, [], {}, ['']

    def __enter__(self):
        modules = self.root.named_modules() if self.root is not None else ()
        self._hooks = [h for name, m in modules for h in (
            m.register_forward_pre_hook(lambda *a, p=name: self._running.append(p)),
            m.register_forward_hook(self._leave))]
        self.counter.__enter__()
        return super().__enter__()

    def _leave(self, *args) -> None:  # a forward hook: returns None, the output stays
        self._running.pop()

    def __exit__(self, *args):
        super().__exit__(*args)
        for h in self._hooks:
            h.remove()
        return self.counter.__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.counter.get_total_flops()
        out = func(*args, **kwargs)
        flops = self.counter.get_total_flops() - before
        for path in set(self._running):
            self._flops[path] = self._flops.get(path, 0) + flops
        name = func._schema.name.split('::')[-1]
        if name in _NO_TRAFFIC or any(r.alias_info is not None and not r.alias_info.is_write
                                      for r in func._schema.returns):  # a view
            return out
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        floats = [a.dtype for a in ins if a.dtype.is_floating_point]
        self.ops.append(Op(name, flops, sum(map(_tensor_bytes, ins + outs)),
                           floats[0] if floats else None))
        return out

    @property
    def flops(self) -> int:
        return sum(o.flops for o in self.ops)

    @property
    def bytes(self) -> int:
        return sum(o.bytes for o in self.ops)

    def module_macs(self) -> Dict[str, int]:
        """Multiply-adds per module path of ``root`` that ran a counted operator (``''``: the
        whole call)."""
        return {path: f // 2 for path, f in self._flops.items() if f or not path}


def count_macs(run: Callable[[], object], root: nn.Module) -> Dict[str, int]:
    """Multiply-adds of ``run()`` (without autograd) per module of ``root``
    (``WorkCounter.module_macs``)."""
    with WorkCounter(root) as counter, torch.no_grad():
        run()
    return counter.module_macs()


@dataclass
class Part:
    """One component of a model: ``params``, ``flops`` (multiply-adds of one inference forward;
    None for a training-only part), ``attention`` (of ``flops``, the attention maps': ``q``-``k``
    products, their application to ``v``, talking-heads mixing) and a ``note``."""
    params: int
    flops: Optional[int]
    attention: int = 0
    note: str = ''


@dataclass
class FlopsReport:
    """Parameters and multiply-adds of one model at one input ``shape``, per part (``backbone``,
    ``neck``, then each head in forward order)."""
    label: str
    task: str
    shape: Tuple[int, int]
    parts: Dict[str, Part] = field(default_factory=dict)

    def group(self, name: str) -> Part:
        """``backbone``, ``neck`` or ``heads`` (all heads summed)."""
        names = [n for n in self.parts if n.endswith('head')] if name == 'heads' else [name]
        parts = [self.parts[n] for n in names if n in self.parts]
        return Part(sum(p.params for p in parts), sum(p.flops or 0 for p in parts),
                    sum(p.attention for p in parts))

    @property
    def params(self) -> int:
        return sum(p.params for p in self.parts.values())

    @property
    def flops(self) -> int:
        return sum(p.flops or 0 for p in self.parts.values())

    def summary(self) -> Dict[str, Optional[float]]:
        """Millions of parameters and GFLOPs (multiply-adds / 1e9) rounded to 0.1, per group
        (the neck's None without one) and in total, and the backbone's attention GFLOPs."""
        out = {}
        for g in ('backbone', 'neck', 'heads'):
            part, present = self.group(g), g != 'neck' or 'neck' in self.parts
            out[f'{g}_params_m'] = round(part.params / 1e6, 1) if present else None
            out[f'{g}_gflops'] = round(part.flops / 1e9, 1) if present else None
        out.update(params_m=round(self.params / 1e6, 1), gflops=round(self.flops / 1e9, 1),
                   attention_gflops=round(self.group('backbone').attention / 1e9, 1))
        return out


def attention_macs(root: nn.Module, macs: Dict[str, int]) -> int:
    """Multiply-adds of the attention maps under ``root``: each of timm's ``XCA`` and
    ``TalkingHeadAttn`` modules' count less its ``qkv`` and ``proj`` projections."""
    from timm.models.cait import TalkingHeadAttn
    from timm.models.xcit import XCA
    return sum(macs.get(name, 0) - macs.get(f'{name}.qkv', 0) - macs.get(f'{name}.proj', 0)
               for name, m in root.named_modules() if isinstance(m, (XCA, TalkingHeadAttn)))


def backbone_macs(backbone: nn.Module, shape: Tuple[int, int],
                  outputs: Optional[dict] = None) -> Dict[str, int]:
    """Multiply-adds per module (``count_macs``) of a backbone's forward on one ``shape`` image,
    as its architecture computes it, on the ``meta`` device (the backbone is moved there); the
    outputs go to ``outputs['outputs']``."""
    backbone = backbone.to('meta').eval()
    x = torch.empty(1, 3, *shape, device='meta')
    box = {} if outputs is None else outputs
    with reference_forward(backbone):
        return count_macs(lambda: box.__setitem__('outputs', backbone(x)), backbone)


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@contextlib.contextmanager
def _empty_roi_features(roi_head: nn.Module):
    """Each RoI extractor (mmdet's ``SingleRoIExtractor`` or a subclass: RoIAlign, not counted)
    returns an empty (meta) tensor of its output's shape."""
    from mmdet.models.roi_heads.roi_extractors import BaseRoIExtractor, SingleRoIExtractor
    extractors = [m for m in roi_head.modules() if isinstance(m, BaseRoIExtractor)]
    other = [type(m).__name__ for m in extractors if not isinstance(m, SingleRoIExtractor)]
    if other:
        raise ValueError(f'RoI extractor {other[0]}: the FLOPs count knows SingleRoIExtractor '
                         '(RoIAlign) only; count with another extractor in --cfg-options')

    def empty_output(self, feats, rois, roi_scale_factor=None):
        size = self.roi_layers[0].output_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        return torch.empty(len(rois), self.out_channels, *size, device='meta')
    for m in extractors:
        m.forward = empty_output.__get__(m)
    try:
        yield
    finally:
        for m in extractors:
            del m.forward


def model_flops(model: nn.Module, task: str, shape: Tuple[int, int], label: str = '',
                backbone_key: Optional[str] = None) -> FlopsReport:
    """Count a built detector or segmentor (moved to the ``meta`` device) at input ``shape``.

    Args:
        model (nn.Module): An mmdet detector or mmseg segmentor.
        task (str): ``'det'`` or ``'seg'``.
        shape (tuple[int, int]): Input height and width (after the preprocessor's padding).
        label (str): The report's name. Default: ``''``.
        backbone_key (str, optional): What the backbone was built from: one counted at
            ``shape`` under the same key in this process is not counted again.

    Returns:
        FlopsReport: Parameters and multiply-adds per component.
    """
    model = model.to('meta').eval()
    report = FlopsReport(label=label, task=task, shape=tuple(shape))
    key, box = (backbone_key, tuple(shape)), {}
    if backbone_key is None or key not in _BACKBONES:
        macs = backbone_macs(model.backbone, shape, outputs=box)
        _BACKBONES[key] = (Part(_params(model.backbone), macs[''],
                                attention_macs(model.backbone, macs)), box['outputs'])
    report.parts['backbone'], feats = dataclasses.replace(_BACKBONES[key][0]), _BACKBONES[key][1]
    if getattr(model, 'neck', None) is not None:
        report.parts['neck'] = Part(_params(model.neck), count_macs(
            lambda: box.__setitem__('feats', model.neck(feats)), model.neck)[''])
        feats = box['feats']
    for name in ('rpn_head', 'bbox_head', 'decode_head'):
        head = getattr(model, name, None)
        if head is not None:
            report.parts[name] = Part(_params(head), count_macs(lambda h=head: h(feats), head)[''])
    roi_head = getattr(model, 'roi_head', None)
    if roi_head is not None:
        n = int(((getattr(model, 'test_cfg', None) or {}).get('rpn') or {}).get('max_per_img',
                                                                                1000))
        from mmengine.structures import InstanceData
        small = [torch.empty(1, f.shape[1], 16, 16, device='meta') for f in feats]  # any size
        boxes = [InstanceData(bboxes=torch.zeros(n, 4))]  # their values change no count
        with _empty_roi_features(roi_head):
            flops = count_macs(lambda: roi_head(small, boxes), roi_head)['']
        report.parts['roi_head'] = Part(
            _params(roi_head), flops,
            note=f'{n} RoIs' + (f', masks on {min(n, _MASK_ROIS)}' if roi_head.with_mask else ''))
    aux = getattr(model, 'auxiliary_head', None)
    if aux is not None:
        aux = aux if isinstance(aux, nn.Module) else nn.ModuleList(aux)
        report.parts['auxiliary_head'] = Part(_params(aux), None, note='training only')
    if report.params != _params(model):
        raise RuntimeError(f'{label or type(model).__name__}: {_params(model) - report.params} '
                           'parameters are outside the components counted (backbone, neck, heads)')
    return report


def config_flops(config: str, shape: Optional[Sequence[int]] = None,
                 cfg_options: Optional[dict] = None) -> FlopsReport:
    """Count a config's model (built on the ``meta`` device: no weights, no initialisation) at
    ``shape`` (default: ``DEFAULT_SHAPES`` of its task) with ``cfg_options`` overrides."""
    from mmengine.logging import MMLogger

    from deepvit_mm.apis.config import build_from_config
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel('WARNING')  # building logs at INFO now and then
    try:
        cfg = load_config(config, cfg_options)
        model, task = build_from_config(cfg, device='meta')
    finally:
        logger.setLevel(level)
    return model_flops(model, task, tuple(shape) if shape else DEFAULT_SHAPES[task],
                       label=osp.splitext(osp.basename(config))[0],
                       backbone_key=repr(cfg.model.backbone.to_dict()))


def flops_markdown(reports: Sequence[FlopsReport]) -> List[str]:
    """A markdown table: #params (M) and GFLOPs of backbone / neck / heads and in total, and the
    backbone's attention share, a row per report."""
    header = ['config', 'input', 'backbone M', 'neck M', 'heads M', '#params M',
              'backbone GFLOPs', '(attention)', 'neck GFLOPs', 'heads GFLOPs', 'GFLOPs']
    rows = [[r.label, size_str(r.shape)] + [fmt(r.summary()[k]) for k in (
        'backbone_params_m', 'neck_params_m', 'heads_params_m', 'params_m', 'backbone_gflops',
        'attention_gflops', 'neck_gflops', 'heads_gflops', 'gflops')] for r in reports]
    return ['| ' + ' | '.join(map(str, r)) + ' |' for r in [header, ['---'] * len(header), *rows]]
