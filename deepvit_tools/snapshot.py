"""What the backbones do, written down to compare two versions of the code value by value
(``tools/analysis/behaviour_snapshot.py``): a restructuring of the models' code should change
none of it.

A snapshot holds, for every ``ColumnarBackbone`` family:

* its arch table: every name it accepts (the timm families: the names of timm's modules), and for
  each of its archs (the timm families: their examples) the spec, the resolved name of its timm
  name, the default taps and ``feature_levels`` of both pyramids over the four strides and the
  three coarsest;
* fresh builds of its smallest archs, both pyramids and every setting of its fast path, seeded:
  the initial state dict (keys and values), the outputs of a train-mode forward (stochastic depth
  drawn from the seed) and their gradients for every parameter, and an eval-mode forward.

Values are compared exactly (``torch.equal``): a seeded build and forward on one machine and
torch give the same bits every time.
"""
import dataclasses
from typing import Any, Dict, Iterator, List, Tuple

import torch

# the builds: each family's smallest archs (the tests' sizes), at a small input
BUILDS = {
    'XCiT': ('nano_12_p16', 'nano_12_p8'),
    'CaiT': ('xxs24',),
    'TimmViT': ('vit_tiny_patch16_224',),
    'TimmEVA': ('eva02_tiny_patch14_224',),
    'TimmBEiT': ('beitv2_base_patch16_224',),
}
# BEiT pads every input to its position grid: built for 96 x 96, not timm's 224 x 224
BUILD_KWARGS = {'TimmBEiT': dict(img_size=96)}
# the families' own arguments and the training controls, each built once more (columnar
# pyramid, default fast path) beside the defaults
VARIANTS = {
    'XCiT': (dict(qkv_cfg=dict(type='SNE')), dict(qkv_cfg=dict(type='FSNE')),
             dict(frozen_stages=2, norm_eval=True), dict(with_cp=True, out_indices=(1, 2, 3, 5))),
    'CaiT': (dict(window_size=2), dict(window_size=2, global_blocks=(0, 3)),
             dict(img_size=96, frozen_stages=0)),
    'TimmViT': (dict(window_size=2), dict(window_size=2, global_blocks=(1,), out_indices=(4,),
                                          out_strides=(32,))),
}
INPUT = (2, 3, 64, 96)
STRIDE_SETS = ((4, 8, 16, 32), (8, 16, 32))
PYRAMIDS = ('columnar', 'simple')


def _plain(value: Any) -> Any:
    """A spec field as lists, tuples, numbers and strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _arch_table(family) -> Iterator[Tuple[str, Any]]:
    names = list(family.arch_zoo)
    yield 'names', names
    examples = list(family.arch_zoo.examples)
    yield 'examples', examples
    for arch in examples:
        spec = family.arch_zoo[arch]
        yield f'{arch}/spec', _plain(spec)
        if spec.timm is not None:  # CaiT's archs of the paper that timm has not
            yield f'{arch}/resolve(timm)', family.arch_zoo.resolve(spec.timm, family.__name__)
        for strides in STRIDE_SETS:
            for pyramid in PYRAMIDS:
                key = f'{arch}/{pyramid}{list(strides)}'
                yield f'{key}/default_out_indices', list(
                    family.default_out_indices(arch, strides, pyramid))
                levels = family.feature_levels(arch, strides, pyramid=pyramid)
                yield f'{key}/feature_levels', _plain(levels._asdict())


def _fast_path_settings(family) -> List[Any]:
    return ['default', True, False] if family.fast_path_name else ['default']


def _settings(family) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(key, constructor arguments) of every build of an arch."""
    for pyramid in PYRAMIDS:
        for fast in _fast_path_settings(family):
            kwargs = dict(pyramid=pyramid)
            if fast != 'default':
                kwargs[family.fast_path_name] = fast
            yield f'{pyramid}/{family.fast_path_name or "fast"}={fast}', kwargs
    for kwargs in VARIANTS.get(family.__name__, ()):
        yield ','.join(f'{k}={v}' for k, v in kwargs.items()), kwargs


def _runs(family, arch: str) -> Iterator[Tuple[str, Any]]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(INPUT, generator=gen)
    for setting, kwargs in _settings(family):
        key = f'{arch}/{setting}'
        torch.manual_seed(0)
        model = family(arch, **BUILD_KWARGS.get(family.__name__, {}), **kwargs)
        for attr in ('arch', 'out_indices', 'out_strides', 'out_channels', 'pad_to',
                     'tap_stride', 'depth', 'embed_dim', 'patch_size', 'window_size',
                     'global_blocks', 'qkv_cfg'):
            if hasattr(model, attr):
                yield f'{key}/attr/{attr}', _plain(getattr(model, attr))
        yield f'{key}/requires_grad', [n for n, p in model.named_parameters()
                                       if p.requires_grad]
        for name, value in model.state_dict().items():
            yield f'{key}/init/{name}', value
        model.train()
        torch.manual_seed(2)  # stochastic depth's draws
        outs = model(x)
        weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(3 + i))
                   for i, o in enumerate(outs)]
        sum((o * w).sum() for o, w in zip(outs, weights)).backward()
        for i, out in enumerate(outs):
            yield f'{key}/train/out{i}', out.detach()
        for name, param in model.named_parameters():
            if param.grad is not None:
                yield f'{key}/grad/{name}', param.grad
        model.eval()
        with torch.no_grad():
            for i, out in enumerate(model(x)):
                yield f'{key}/eval/out{i}', out


def snapshot(families=None, archs=None) -> Dict[str, Any]:
    """The snapshot of ``families`` (names; default: every family), ``{key: value}``; with
    ``archs``, only those of ``BUILDS`` are built (the arch tables are whole)."""
    from deepvit_mm import ColumnarBackbone
    known = {fam.__name__: fam for fam in ColumnarBackbone.families}
    unknown = set(families or ()) - set(known)
    if unknown:
        raise ValueError(f'unknown families {sorted(unknown)}; known: {sorted(known)}')
    out = {'families': sorted(known)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: reductions in one order, whatever the machine's cores
    try:
        for name in families or sorted(known):
            family = known[name]
            for key, value in _arch_table(family):
                out[f'{name}/table/{key}'] = value
            for arch in BUILDS.get(name, ()):
                if archs is not None and arch not in archs:
                    continue
                for key, value in _runs(family, arch):
                    out[f'{name}/build/{key}'] = value
    finally:
        torch.set_num_threads(threads)
    return out


def _count(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, dict):
        return sum(_count(v) for v in value.values()) + len(value)
    if isinstance(value, (list, tuple)):
        return sum(_count(v) for v in value) + 1
    return 1


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    return a == b


def compare(before: Dict[str, Any], after: Dict[str, Any]) -> Tuple[int, List[str]]:
    """``(values compared, differences)``: each difference a line naming its key."""
    compared, diffs = 0, []
    for key in sorted(set(before) | set(after)):
        if key not in after:
            diffs.append(f'{key}: only before')
        elif key not in before:
            diffs.append(f'{key}: only after')
        else:
            compared += _count(before[key])
            if not _same(before[key], after[key]):
                a, b = before[key], after[key]
                if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) \
                        and a.shape == b.shape and a.dtype == b.dtype:
                    diff = (a.double() - b.double()).abs()
                    diffs.append(f'{key}: {int((diff != 0).sum())} of {a.numel()} values differ '
                                 f'(max {float(diff.max()):.3g})')
                else:
                    diffs.append(f'{key}: {_short(a)} -> {_short(b)}')
    return compared, diffs


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f'tensor{tuple(value.shape)} {value.dtype}'
    text = repr(value)
    return text if len(text) < 200 else text[:200] + '...'
