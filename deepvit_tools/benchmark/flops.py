"""Parameters and FLOPs of a config's model, backbone / neck / heads apart, attention included.

How the count is taken:

* Every matrix product and convolution is counted by ``torch.utils.flop_counter.FlopCounterMode``
  (torch's dispatch-level counter: ``mm``, ``addmm``, ``bmm``, ``baddbmm``, convolutions, fused
  attention), on the ATen ops a forward really runs. So the attention products are counted
  wherever they happen: XCiT's cross-covariance attention (``q^T k`` and ``attn v``, ``d^2 N / h``
  multiply-adds each), CaiT's talking-heads attention (``q k^T`` and ``attn v``, ``N^2 d`` each,
  and the two head-mixing maps, ``N^2 h^2`` each), windowed or global as configured.
* FLOPs are multiply-adds (one per multiply-accumulate), the convention of fvcore, mmengine's
  ``get_model_complexity_info``, mmdet's/mmseg's ``get_flops`` and of the XCiT and Swin papers;
  element-wise work (norms, activations, softmax, pooling, resizing) is not counted.
* The backbone, neck and dense heads run on the ``meta`` device: shapes only, no arithmetic. A
  trunk's blocks that are built alike and called alike (same modules, settings, parameter shapes
  and inputs) compute the same operations, so each such block is run once and its repeats take its
  count (``_repeats_counted_once``): a 24-block trunk runs about one block's worth of meta ops.
  XCiT counts its blocks as timm computes them (``gram_xca=False``; its Gram-matrix path gives
  the same result with fewer multiply-adds).
* Two-stage RoI heads run as mmdet's ``tools/analysis_tools/get_flops.py`` runs them (the
  detector's ``tensor`` mode, ``StandardRoIHead.forward``): the box head on ``max_per_img`` RoIs of
  the RPN's test config (1000 in the recipes) and the mask head on the first 100. Their cost does
  not depend on the image (RoIAlign, an mmcv op, is not counted): mmdet's ``SingleRoIExtractor``
  is replaced by an empty output of its shape and the heads count on the meta device; a head with
  another extractor runs on real, small maps.
* Inference only: mmseg's auxiliary head (a training loss) counts in the parameters, as mmseg's
  ``get_flops`` counts it, but runs in no forward.

``tests/tools/test_zoo.py`` checks the count against an independent one: fvcore's jit-trace
counter on timm's own model (``forward_features``), block by block.
"""
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .models import load_config, reference_forward
from .report import fmt, markdown_table, size_str

__all__ = ['DEFAULT_SHAPES', 'Part', 'FlopsReport', 'count_macs', 'attention_macs',
           'backbone_macs', 'model_flops', 'config_flops', 'flops_markdown']

# The input sizes of the README's tables: COCO's 800 x 1333 padded to a multiple of 32 (mmdet's
# data preprocessor), ADE20k's 512 x 512 crops
DEFAULT_SHAPES = {'det': (800, 1344), 'seg': (512, 512)}
# mmdet's StandardRoIHead.forward (tensor mode) runs the mask head on this many RoIs
_MASK_ROIS = 100
# RoI heads' multiply-adds by (architecture, RoIs, input channels): a head counted once a process
# is not run again (one with another extractor than mmdet's runs for real: RoIAlign has no meta
# kernel)
_ROI_HEAD_MACS: Dict[tuple, int] = {}
# Backbones' counts (their ``Part`` and meta outputs) by (task, backbone config, input shape): the
# recipes of two heads on one backbone (Semantic FPN and UperNet) count it once a process
_BACKBONE_COUNTS: Dict[tuple, Tuple['Part', object]] = {}


def flop_counter(root: torch.nn.Module) -> Any:
    """A ``torch.utils.flop_counter.FlopCounterMode`` (no display) that keys counts by module
    path under ``root``'s class name (``XCiT.trunk.blocks.0``), for a forward without autograd.

    torch 2.1's own module tracking (``mods=``) wraps each module's inputs in an autograd function
    that flattens them, which breaks modules taking a tuple of maps (mmdet's FPN): there plain
    forward hooks push and pop the counter's module stack instead.
    """
    from torch.utils import flop_counter as fc
    if hasattr(fc, 'ModuleTracker'):
        return fc.FlopCounterMode(display=False)

    class HookedFlopCounter(fc.FlopCounterMode):
        def __enter__(self):
            self._handles = []
            base = type(root).__name__
            for name, module in root.named_modules():
                path = f'{base}.{name}' if name else base
                self._handles += [
                    module.register_forward_pre_hook(lambda m, a, p=path: self.parents.append(p)),
                    module.register_forward_hook(lambda m, a, o, p=path: self._leave(p))]
            return super().__enter__()

        def _leave(self, path: str) -> None:
            del self.parents[len(self.parents) - 1 - self.parents[::-1].index(path)]

        def __exit__(self, *args):
            for handle in self._handles:
                handle.remove()
            return super().__exit__(*args)
    return HookedFlopCounter(display=False)


@dataclass
class Part:
    """One component of a model.

    Attributes:
        params (int): Parameters.
        flops (int, optional): Multiply-adds of one inference forward; None for a component that
            runs in training only.
        attention (int): Of ``flops``, those of the attention maps (``q``-``k`` products, their
            application to ``v``, talking-heads mixing); the Q/K/V and output projections are
            not included.
        note (str): How it was counted, where that needs saying.
    """
    params: int
    flops: Optional[int]
    attention: int = 0
    note: str = ''


@dataclass
class FlopsReport:
    """Parameters and multiply-adds of one model at one input size.

    Attributes:
        label (str): The config's name.
        task (str): ``'det'`` or ``'seg'``.
        shape (tuple[int, int]): Input height and width.
        parts (dict[str, Part]): ``backbone``, ``neck`` (where the model has one), then each head
            (``rpn_head``, ``roi_head``; ``decode_head``, ``auxiliary_head``), in forward order.
    """
    label: str
    task: str
    shape: Tuple[int, int]
    parts: Dict[str, Part] = field(default_factory=dict)

    def group(self, name: str) -> Part:
        """``backbone``, ``neck`` or ``heads`` (every head summed; training-only ones add
        parameters only)."""
        names = [n for n in self.parts if n.endswith('head')] if name == 'heads' else [name]
        parts = [self.parts[n] for n in names if n in self.parts]
        return Part(params=sum(p.params for p in parts),
                    flops=sum(p.flops or 0 for p in parts),
                    attention=sum(p.attention for p in parts))

    @property
    def params(self) -> int:
        return sum(p.params for p in self.parts.values())

    @property
    def flops(self) -> int:
        return sum(p.flops or 0 for p in self.parts.values())

    def summary(self) -> Dict[str, float]:
        """Millions of parameters and GFLOPs (multiply-adds / 1e9), rounded to 0.1, per group and
        in total (the README's tables; the metafiles hold the exact totals); the neck's are None
        for a model without one."""
        out = {}
        for g in ('backbone', 'neck', 'heads'):
            part = self.group(g)
            present = g != 'neck' or 'neck' in self.parts  # UperNet has no neck: None
            out[f'{g}_params_m'] = round(part.params / 1e6, 1) if present else None
            out[f'{g}_gflops'] = round(part.flops / 1e9, 1) if present else None
        out['params_m'] = round(self.params / 1e6, 1)
        out['gflops'] = round(self.flops / 1e9, 1)
        out['attention_gflops'] = round(self.group('backbone').attention / 1e9, 1)
        return out


def count_macs(run: Callable[[], object], root: nn.Module) -> Dict[str, int]:
    """Multiply-adds of ``run()`` per module of ``root`` (``''`` is ``root`` itself, then
    ``named_modules`` paths), counted by ``torch.utils.flop_counter.FlopCounterMode``.

    Args:
        run (Callable): Calls ``root`` (or its modules) once.
        root (nn.Module): The module whose submodules the counts are keyed by.

    Returns:
        dict[str, int]: Multiply-adds (FLOPs / 2) of each module that ran any counted op.
    """
    counter = flop_counter(root)
    with counter, torch.no_grad():
        run()
    # the counter keys modules by their path under the class name of the module first called
    # (``XCiT.trunk.blocks.0``) and sums everything under ``Global``
    prefix = type(root).__name__
    out = {}
    for key, ops in counter.get_flop_counts().items():
        if key == 'Global':
            continue
        name = key[len(prefix) + 1:] if key.startswith(prefix + '.') else ''
        if key != prefix and not key.startswith(prefix + '.'):
            continue
        out[name] = sum(ops.values()) // 2
    out[''] = counter.get_total_flops() // 2
    return out


def _attention_modules(root: nn.Module) -> Iterator[Tuple[str, nn.Module]]:
    """timm's attention modules under ``root``: XCiT's ``XCA``, CaiT's ``TalkingHeadAttn`` (and
    deepvit_mm's windowed subclass)."""
    from timm.models.cait import TalkingHeadAttn
    from timm.models.xcit import XCA
    for name, m in root.named_modules():
        if isinstance(m, (XCA, TalkingHeadAttn)):
            yield name, m


def attention_macs(root: nn.Module, macs: Dict[str, int]) -> int:
    """Multiply-adds of the attention maps under ``root``: each attention module's count less
    its Q/K/V embedding (``qkv``, linear or not) and output projection (``proj``). What remains
    is ``q``-``k`` products, their application to ``v`` and, for talking heads, the head mixing
    (``proj_l``, ``proj_w``)."""
    total = 0
    for name, _ in _attention_modules(root):
        prefix = f'{name}.' if name else ''
        total += macs.get(name, 0) - macs.get(prefix + 'qkv', 0) - macs.get(prefix + 'proj', 0)
    return total


def _params(m: Optional[nn.Module]) -> int:
    return sum(p.numel() for p in m.parameters()) if m is not None else 0


@contextlib.contextmanager
def _counting_backbone(backbone: nn.Module) -> Iterator[None]:
    """The backbone as its architecture computes it: a deepvit_mm backbone runs timm's forward
    (the multiply-adds the papers count) rather than its faster path, restored afterwards."""
    with reference_forward(backbone):
        yield


def _plain(v: Any) -> Any:
    """A module attribute as a key: scalars as they are, tensors by shape and dtype, functions by
    name, anything else by its ``repr`` (one that shows an address never matches another)."""
    if v is None or isinstance(v, (bool, int, float, str, torch.dtype)):
        return v
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, torch.Tensor):
        return ('tensor', tuple(v.shape), v.dtype)
    if callable(v) and hasattr(v, '__qualname__'):
        return (getattr(v, '__module__', ''), v.__qualname__)
    return repr(v)


def _structure(module: nn.Module) -> tuple:
    """What a module's eval forward computes from, as a key: every submodule's class, its public
    attributes (window sizes, head counts, scales, flags) and its parameters' and buffers' shapes.
    Dropout, drop path (at any rate) and ``nn.Identity`` (timm's drop path at rate 0) are one
    kind: each is the identity in an eval forward."""
    from timm.layers import DropPath
    parts = []
    for name, sub in module.named_modules():
        identity = isinstance(sub, (DropPath, nn.Dropout, nn.Identity))
        attrs = () if identity else tuple(sorted(
            (k, _plain(v)) for k, v in vars(sub).items()
            if not k.startswith('_') and k != 'training'))
        tensors = tuple((n, tuple(t.shape), t.dtype) for n, t in (
            *sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False)))
        parts.append((name, 'identity' if identity else type(sub), attrs, tensors))
    return tuple(parts)


def _call_key(args: tuple, kwargs: dict) -> tuple:
    return tuple(('tensor', tuple(a.shape), a.dtype, a.stride()) if isinstance(a, torch.Tensor)
                 else _plain(a) for a in (*args, *sorted(kwargs.items())))


@contextlib.contextmanager
def _repeats_counted_once(root: nn.Module) -> Iterator[Callable[[Dict[str, int]], None]]:
    """Within the block: each element of ``root``'s ``ModuleList`` / ``Sequential`` containers
    (the outermost ones: a trunk's blocks) that has the ``_structure`` and inputs of one called
    before it runs no operation but returns empty (meta) tensors of that one's outputs. Yields
    ``fill(macs)``, which gives each such repeat, in a ``count_macs`` result, the counts of the
    block it repeats (its submodules' too) and adds them to its containers' and the root's."""
    from torch.utils._pytree import tree_map
    blocks = [(f'{name}.{child}' if name else child, m)
              for name, container in root.named_modules()
              if isinstance(container, (nn.ModuleList, nn.Sequential))
              for child, m in container.named_children() if next(m.parameters(), None) is not None]
    blocks = [(p, m) for p, m in blocks if not any(p.startswith(b + '.') for b, _ in blocks)]
    saved = [m.__dict__.get('forward') for _, m in blocks]  # an instance's own forward, if any
    first: Dict[tuple, tuple] = {}  # key: (path, outputs) of the first block called so
    repeats: List[Tuple[str, str, set]] = []  # (repeat's path, its first's, the modules it ran in)
    running: List[str] = []  # the paths of the modules being called (as the counter keys them)

    def enter(path: str) -> Callable:
        def hook(module, args) -> None:
            running.append(path)
        return hook

    def leave(module, args, output) -> None:
        running.pop()
    hooks = [h for name, m in root.named_modules()
             for h in (m.register_forward_pre_hook(enter(name)), m.register_forward_hook(leave))]

    def patched(path: str, module: nn.Module, forward: Callable) -> Callable:
        def run(*args, **kwargs):
            key = (_structure(module), _call_key(args, kwargs))
            if key not in first:
                out = forward(*args, **kwargs)
                first[key] = (path, out)
                return out
            repeats.append((path, first[key][0], set(running[:-1]) | {''}))
            return tree_map(lambda t: torch.empty_like(t) if isinstance(t, torch.Tensor) else t,
                            first[key][1])
        return run

    for path, m in blocks:
        m.forward = patched(path, m, m.forward)

    def fill(macs: Dict[str, int]) -> None:
        for path, of, outer in repeats:
            for key in [k for k in macs if k == of or k.startswith(of + '.')]:
                macs[path + key[len(of):]] = macs[key]
            for parent in outer:  # '': the total
                macs[parent] = macs.get(parent, 0) + macs.get(of, 0)
    try:
        yield fill
    finally:
        for h in hooks:
            h.remove()
        for (_, m), forward in zip(blocks, saved):
            if forward is None:
                del m.forward
            else:
                m.forward = forward


def backbone_macs(backbone: nn.Module, shape: Tuple[int, int],
                  outputs: Optional[dict] = None) -> Dict[str, int]:
    """Multiply-adds of a backbone's forward on one ``shape`` image, per module (``count_macs``),
    counted on the ``meta`` device (the backbone is moved there) as its architecture computes it.

    Args:
        backbone (nn.Module): A deepvit_mm backbone (or any backbone taking ``(1, 3, H, W)``).
        shape (tuple[int, int]): Input height and width.
        outputs (dict, optional): Receives the (meta) outputs under ``'outputs'``.

    Returns:
        dict[str, int]: ``''`` the whole backbone, then each module path that ran counted ops.
    """
    backbone = backbone.to('meta').eval()
    x = torch.empty(1, 3, *shape, device='meta')
    box = {} if outputs is None else outputs
    with _counting_backbone(backbone), _repeats_counted_once(backbone) as fill:
        macs = count_macs(lambda: box.__setitem__('outputs', backbone(x)), backbone)
    fill(macs)
    return macs


def _proposals(n: int, shape: Tuple[int, int]):
    """``n`` fixed boxes of sizes 16..512 spread over an image of ``shape`` (what the RPN hands
    the RoI head; their values do not change the count)."""
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(0)
    h, w = shape
    size = 2 ** (4 + 5 * torch.rand(n, 2, generator=g))  # log-uniform in [16, 512)
    size = torch.minimum(size, torch.tensor([w - 1.0, h - 1.0]))
    x0 = torch.rand(n, generator=g) * (w - size[:, 0])
    y0 = torch.rand(n, generator=g) * (h - size[:, 1])
    boxes = torch.stack([x0, y0, x0 + size[:, 0], y0 + size[:, 1]], dim=1)
    return InstanceData(bboxes=boxes)


def model_flops(model: nn.Module, task: str, shape: Tuple[int, int], label: str = '',
                backbone_key: Optional[str] = None) -> FlopsReport:
    """Count a built detector or segmentor at input ``shape`` (one image).

    The model is moved to the ``meta`` device (a RoI head whose extractor is not mmdet's
    ``SingleRoIExtractor`` to real CPU memory): build it for counting only, e.g. under
    ``torch.device('meta')``.

    Args:
        model (nn.Module): An mmdet detector or mmseg segmentor (``backbone``, optional ``neck``,
            ``rpn_head`` + ``roi_head``, ``bbox_head``, or ``decode_head`` + optional
            ``auxiliary_head``).
        task (str): ``'det'`` or ``'seg'``.
        shape (tuple[int, int]): Input height and width (after the data preprocessor's padding).
        label (str): The report's name. Default: ``''``.
        backbone_key (str, optional): What the backbone was built from (its config): a backbone
            counted at ``shape`` under the same key in this process is not counted again.

    Returns:
        FlopsReport: Parameters and multiply-adds per component.
    """
    model.eval()
    report = FlopsReport(label=label, task=task, shape=tuple(shape))
    meta = torch.device('meta')

    key = None if backbone_key is None else (task, backbone_key, tuple(shape))
    counted = _BACKBONE_COUNTS.get(key)
    if counted is None:
        box = {}
        macs = backbone_macs(model.backbone, shape, outputs=box)
        counted = (Part(_params(model.backbone), macs[''], attention_macs(model.backbone, macs)),
                   box['outputs'])
        if key is not None:
            _BACKBONE_COUNTS[key] = counted
    report.parts['backbone'], feats = dataclasses.replace(counted[0]), counted[1]
    box = {}

    neck = getattr(model, 'neck', None)
    if neck is not None:
        neck = neck.to(meta)
        macs = count_macs(lambda: box.__setitem__('feats', neck(feats)), neck)
        feats = box['feats']
        report.parts['neck'] = Part(_params(neck), macs[''])

    for name in ('rpn_head', 'bbox_head', 'decode_head'):
        head = getattr(model, name, None)
        if head is not None:
            head = head.to(meta)
            report.parts[name] = Part(_params(head), count_macs(lambda h=head: h(feats), head)[''])

    roi_head = getattr(model, 'roi_head', None)
    if roi_head is not None:
        rpn_cfg = (model.test_cfg or {}).get('rpn', {}) if hasattr(model, 'test_cfg') else {}
        n = int(rpn_cfg.get('max_per_img', 1000))
        key = (repr(roi_head), n, tuple(f.shape[1] for f in feats))
        if key not in _ROI_HEAD_MACS:  # the same head, the same count: once a process
            on_meta = _meta_roi_extractors(roi_head)
            if on_meta is None:  # another extractor: the head runs for real, on small maps
                roi_head = roi_head.to_empty(device='cpu') if _on_meta(roi_head) else roi_head
                on_meta = contextlib.nullcontext()
            device = next(roi_head.parameters()).device
            small = [torch.zeros(1, f.shape[1], 16, 16, device=device) for f in feats]  # any size
            proposals = [_proposals(n, shape)]
            with on_meta:
                _ROI_HEAD_MACS[key] = count_macs(lambda: roi_head(small, proposals), roi_head)['']
        report.parts['roi_head'] = Part(
            _params(roi_head), _ROI_HEAD_MACS[key],
            note=f'{n} RoIs' + (f', masks on {min(n, _MASK_ROIS)}' if roi_head.with_mask else ''))

    aux = getattr(model, 'auxiliary_head', None)
    if aux is not None:
        aux = aux if isinstance(aux, nn.Module) else nn.ModuleList(aux)
        report.parts['auxiliary_head'] = Part(_params(aux), None, note='training only')
    counted = sum(p.params for p in report.parts.values())
    if counted != _params(model):
        raise RuntimeError(f'{label or type(model).__name__}: {_params(model) - counted} parameters '
                           'are outside the components counted (backbone, neck, heads)')
    return report


def _meta_roi_extractors(roi_head: nn.Module) -> Optional[contextlib.AbstractContextManager]:
    """Where every RoI extractor of ``roi_head`` is mmdet's ``SingleRoIExtractor`` (mmcv's
    RoIAlign: no counted op, and no meta kernel), a context in which each returns an empty tensor
    of its output's shape on the ``meta`` device, so that a head on the meta device counts without
    computing; None for any other extractor (``CPUSingleRoIExtractor``'s gather multiplies)."""
    from mmdet.models.roi_heads.roi_extractors import BaseRoIExtractor, SingleRoIExtractor
    extractors = [m for m in roi_head.modules() if isinstance(m, BaseRoIExtractor)]
    if not extractors or any(type(m) is not SingleRoIExtractor for m in extractors):
        return None
    if not _on_meta(roi_head):
        return None

    def empty_output(self, feats, rois, roi_scale_factor=None):
        size = self.roi_layers[0].output_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        return torch.empty(len(rois), self.out_channels, *size, device='meta')

    @contextlib.contextmanager
    def patched():
        for m in extractors:
            m.forward = empty_output.__get__(m)
        try:
            yield
        finally:
            for m in extractors:
                del m.forward
    return patched()


def _on_meta(m: nn.Module) -> bool:
    return any(t.is_meta for t in list(m.parameters()) + list(m.buffers()))


def _build_on_meta(cfg) -> Tuple[nn.Module, str]:
    """The config's model with every tensor on the ``meta`` device: no memory, no initialisation
    (``deepvit_mm.apis.build_from_config(cfg, device='meta')``), its build logs muted."""
    from mmengine.logging import MMLogger

    from deepvit_mm.apis.config import build_from_config
    # building logs at INFO now and then: keep the count's output to itself
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel('WARNING')
    try:
        return build_from_config(cfg, device='meta')
    finally:
        logger.setLevel(level)


def config_flops(config: str, shape: Optional[Sequence[int]] = None,
                 cfg_options: Optional[dict] = None) -> FlopsReport:
    """Count a config's detector or segmentor (built on the ``meta`` device, no weights read).

    Args:
        config (str): An mmdet or mmseg config file.
        shape (Sequence[int], optional): Input height and width; default: ``DEFAULT_SHAPES`` of
            the config's task (800x1344 detection, 512x512 segmentation).
        cfg_options (dict, optional): Overrides, as ``--cfg-options`` gives them.

    Returns:
        FlopsReport: Parameters and multiply-adds per component.
    """
    import os.path as osp

    cfg = load_config(config, cfg_options)
    model, task = _build_on_meta(cfg)
    shape = tuple(shape) if shape else DEFAULT_SHAPES[task]
    return model_flops(model, task, shape, label=osp.splitext(osp.basename(config))[0],
                       backbone_key=repr(cfg.model.backbone.to_dict()))


def flops_markdown(reports: Sequence[FlopsReport]) -> List[str]:
    """One markdown table: #params (M) and GFLOPs (multiply-adds) of backbone / neck / heads and
    in total, and the backbone's attention share, one row per report."""
    rows = []
    for r in reports:
        s = r.summary()
        rows.append([r.label, size_str(r.shape)] + [fmt(s[k]) for k in (
            'backbone_params_m', 'neck_params_m', 'heads_params_m', 'params_m', 'backbone_gflops',
            'attention_gflops', 'neck_gflops', 'heads_gflops', 'gflops')])
    header = ['config', 'input', 'backbone M', 'neck M', 'heads M', '#params M',
              'backbone GFLOPs', '(attention)', 'neck GFLOPs', 'heads GFLOPs', 'GFLOPs']
    return markdown_table(header, rows)
