"""Every backbone family and arch through one harness (timm's tests/test_models.py is the model):
the papers' sizes, output shapes and strides, finite outputs, a gradient for every trainable
parameter, the taps equal to timm's own model, ``with_cp``, input and argument checks,
``frozen_stages`` and ``norm_eval``.

What only one family has (XCiT's Q/K/V embeddings and fast path, CaiT's position-embedding
resampling, windows and query chunks, each family's checkpoints and recipes) is tested in
test_xcit.py, test_xcit_fast.py, test_qkv.py and test_cait.py; timm's families (ViT, EVA-02, BEiT:
any name of their timm modules, conftest.TIMM_FAMILY_ARCHS here) in test_timm_families.py too.
"""
import copy
import functools
import itertools

import pytest
import timm
import torch
import torch.nn.functional as F
from conftest import EARLY, SMALL_GRID, TIMM_FAMILY_ARCHS, family_archs, randomize_
from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS
from timm.layers import DropPath, to_2tuple
from timm.models.cait import Cait
from torch.nn.modules.batchnorm import _BatchNorm

from deepvit_mm import ColumnarBackbone, XCiT
from deepvit_mm.utils import meta_device

FAMILIES = {fam.__name__: fam for fam in ColumnarBackbone.families}
ARCHS = [(name, arch) for name, fam in FAMILIES.items() for arch in family_archs(fam)]


# The papers' tables, written out here as the reference the arch tables are checked against:
# depth, embed_dim, heads, stochastic depth, LayerScale init, default taps.
def _xcit_paper(arch):
    # XCiT Table 1 (d, heads) and Table B.1 (drop rate, LayerScale eps); taps: appendix B.2's
    # blocks 4/6/8/12 of 12-layer models, 8/12/16/24 of 24-layer ones (1-based)
    size, depth, patch = arch.split('_')
    dim, heads = {'nano': (128, 4), 'tiny': (192, 4), 'small': (384, 8), 'medium': (512, 8),
                  'large': (768, 16)}[size]
    drop = {'nano_12': 0.0, 'tiny_12': 0.0, 'tiny_24': 0.05, 'small_12': 0.05, 'small_24': 0.1,
            'medium_24': 0.15, 'large_24': 0.3 if patch == 'p8' else 0.25}[f'{size}_{depth}']
    eps = 1.0 if depth == '12' else 1e-5
    taps = (3, 5, 7, 11) if depth == '12' else (7, 11, 15, 23)
    return dict(depth=int(depth), embed_dim=dim, heads=heads, patch=int(patch[1:]), drop=drop,
                eps=eps, taps=taps)


def _cait_paper(arch):
    # CaiT Table 3 (d, heads = d / 48) and Table 4 (drop rate, LayerScale eps); taps: blocks at
    # 1/3, 1/2, 2/3 and the end of the trunk (deepvit_mm's choice, see models/backbones/cait/model.py)
    size, depth = arch[:-2], int(arch[-2:])
    dim = {'xxs': 192, 'xs': 288, 's': 384, 'm': 768}[size]
    drop, eps = {'xxs24': (0.05, 1e-5), 'xxs36': (0.1, 1e-6), 'xs24': (0.05, 1e-5),
                 'xs36': (0.1, 1e-6), 's24': (0.1, 1e-5), 's36': (0.2, 1e-6), 's48': (0.3, 1e-6),
                 'm24': (0.2, 1e-5), 'm36': (0.3, 1e-6), 'm48': (0.4, 1e-6)}[arch]
    taps = {24: (7, 11, 15, 23), 36: (11, 17, 23, 35), 48: (15, 23, 31, 47)}[depth]
    return dict(depth=depth, embed_dim=dim, heads=dim // 48, patch=16, drop=drop, eps=eps,
                taps=taps)


PAPER = {'XCiT': _xcit_paper, 'CaiT': _cait_paper}
PAPER_ARCHS = [fa for fa in ARCHS if fa[0] in PAPER]  # the timm families' tables are timm's


def test_every_family_is_tested():
    assert set(FAMILIES) == set(PAPER) | set(TIMM_FAMILY_ARCHS)


def _dim(family, arch) -> int:
    return FAMILIES[family].arch_zoo[arch].embed_dim

# As timm's EXCLUDE lists: 66-350M parameters take 2-10 s each to initialise on 2 CPU cores, and
# their code is the smaller sizes' with other widths and depths. These are checked for their
# structure on the meta device (test_builds_as_the_paper_specifies), their input checks, and
# output shapes and finite outputs at one size with 4 blocks (early taps); the light sizes get
# every check below at full depth.
HEAVY = {('XCiT', a) for a in XCiT.arch_zoo if a.startswith(('medium', 'large'))} | \
        {('CaiT', a) for a in ('s36', 's48', 'm24', 'm36', 'm48')} | \
        {('TimmBEiT', a) for a in TIMM_FAMILY_ARCHS['TimmBEiT'] if a != 'test_beit'}
# with_cp is compared on the archs of width <= 192 (both patch sizes and depths of XCiT, both
# depths of CaiT): a second model with_cp=True costs a build and a forward-backward more, and
# with_cp is the same code at every width (with frozen stages and drop path: the training controls
# below)
CP = [fa for fa in ARCHS if fa not in HEAVY and FAMILIES[fa[0]].arch_zoo[fa[1]].embed_dim <= 192]
LIGHT = CP + [fa for fa in ARCHS if fa not in HEAVY and fa not in CP]
# each list a prefix of the next, so that an arch has the same parameter index in all of them:
# pytest then runs the tests of one arch together and builds it once (the `backbone` fixture)
ALL = LIGHT + [fa for fa in ARCHS if fa in HEAVY]
SIZES = [(64, 64), (64, 96), (50, 70)]  # square, non-square, not a multiple of the patch
SMALLEST = {name: min(family_archs(fam), key=lambda a, z=fam.arch_zoo: (
    z[a].embed_dim * z[a].depth, -z[a].patch_size))
    for name, fam in FAMILIES.items()}  # patch 16 on a tie: its adapter has a BatchNorm


def _ids(params):
    return [f'{f}-{a}' for f, a in params]


@functools.cache
def _meta(family, arch, **kwargs) -> ColumnarBackbone:
    # the meta device runs the whole constructor without allocating or initialising the weights
    with meta_device():
        return FAMILIES[family](arch, **kwargs)


@pytest.fixture(scope='module')
def backbone(request):
    """``(family, arch, model)``, parametrized indirectly with ``LIGHT`` or ``ALL``: a light arch
    built at full depth, a heavy one on the meta device (structure only). Built once per arch;
    tests that change modes, gradients or weights take a copy (``_copy``)."""
    family, arch = request.param
    if (family, arch) in HEAVY:
        return family, arch, _meta(family, arch)
    return family, arch, FAMILIES[family](arch)


def _copy(backbone) -> ColumnarBackbone:
    return copy.deepcopy(backbone[2])


def _on(params):
    """Parametrize the ``backbone`` fixture. The light archs but each family's smallest are built
    at full size for these tests (seconds each): they are marked slow, and the fast tier runs the
    smallest and the heavy ones (on the meta device)."""
    return pytest.mark.parametrize('backbone', [
        pytest.param(fa, id=i, marks=pytest.mark.slow if fa not in HEAVY and fa[1] != SMALLEST[fa[0]]
                     else ()) for fa, i in zip(params, _ids(params))], indirect=True)


def _heavy(family, arch) -> ColumnarBackbone:
    """A heavy arch with its first 4 blocks, built on the meta device and given random values
    (shapes and finiteness do not depend on the values, but a CPU forward needs some)."""
    m = copy.deepcopy(_meta(family, arch, out_indices=EARLY)).to_empty(device='cpu')
    with torch.no_grad():
        for n, t in itertools.chain(m.named_parameters(), m.named_buffers()):
            if n.endswith('running_var'):
                t.fill_(1.0)
            elif t.is_floating_point():
                t.normal_(0, 0.02)
            else:
                t.zero_()
    return m


def _padded(m, hw):
    """The size ``m`` pads an input to: a multiple of 32 (BEiT: its ``img_size``)."""
    return m._padded_size(*hw)


# ------------------------------------------------------------------------------ structure
@_on([fa for fa in ALL if fa[0] in PAPER])
def test_builds_as_the_paper_specifies(backbone):
    """Depth, width, heads, patch, taps, stochastic depth and no classifier, as the paper's
    table says. Marked slow where ``_on`` builds a larger light arch at full size (seconds)."""
    family, arch, m = backbone
    paper = PAPER[family](arch)
    dim = paper['embed_dim']
    assert (m.depth, len(m.trunk.blocks), m.embed_dim, m.patch_size) == \
        (paper['depth'], paper['depth'], dim, paper['patch'])
    assert tuple(to_2tuple(m.trunk.patch_embed.patch_size)) == (paper['patch'],) * 2
    assert all(b.attn.num_heads == paper['heads'] for b in m.trunk.blocks)
    assert m.out_indices == paper['taps']
    assert (m.out_channels, m.out_strides) == ([dim] * 4, (4, 8, 16, 32))
    # the arch table's stochastic depth (in every block; timm builds no DropPath at rate 0) and
    # LayerScale init (its values: test_layer_scale_starts_at_the_papers_init)
    spec = m.arch_zoo[arch]
    assert (spec.drop_path_rate, spec.eta) == (pytest.approx(paper['drop']), paper['eps'])
    rates = {d.drop_prob for d in m.trunk.modules() if isinstance(d, DropPath)}
    assert sorted(rates) == ([pytest.approx(paper['drop'])] if paper['drop'] else [])
    # the classifier (class token, class attention, final norm, head) is not built
    parts = tuple(f'trunk.{p}' for p in m.classifier_parts)
    assert not [k for k in m.state_dict() if k in parts or k.startswith(tuple(p + '.' for p in parts))]


@_on([fa for fa in LIGHT if fa[0] in PAPER])
def test_layer_scale_starts_at_the_papers_init(backbone):
    """Every LayerScale starts at the paper's init. Marked slow where ``_on`` builds a larger
    light arch at full size (seconds)."""
    family, arch, m = backbone
    eps = PAPER[family](arch)['eps']
    gammas = [p for n, p in m.named_parameters()
              if n.rsplit('.', 1)[-1] in ('gamma1', 'gamma2', 'gamma3', 'gamma_1', 'gamma_2')]
    assert gammas and all(torch.all(g == eps) for g in gammas)


# a family with LayerScale, each at an arch that has it
LAYER_SCALE = {'XCiT': SMALLEST['XCiT'], 'CaiT': SMALLEST['CaiT'],
               'TimmViT': 'vit_small_patch14_reg4_dinov2', 'TimmBEiT': SMALLEST['TimmBEiT']}


@pytest.mark.parametrize('family', FAMILIES)
def test_layer_scale_init_and_drop_path_arguments(family):
    arch = LAYER_SCALE.get(family, SMALLEST[family])
    kw = dict(layer_scale_init=0.1) if family in LAYER_SCALE else {}
    m = FAMILIES[family](arch, out_indices=EARLY, drop_path_rate=0.2, **kw)
    gammas = [p for n, p in m.named_parameters() if '.gamma' in n]
    assert bool(gammas) == bool(kw) and all(torch.all(g == 0.1) for g in gammas)
    if family in PAPER:  # uniform over the blocks, as in the papers
        assert sorted({d.drop_prob for d in m.modules() if isinstance(d, DropPath)}) == [0.2]
    else:  # timm's linear rule over the whole depth, also when the blocks after a tap are not built
        depth = FAMILIES[family].arch_zoo[arch].depth
        want = [0.2 * i / (depth - 1) for i in range(len(m.trunk.blocks))]
        got = [max([d.drop_prob for d in blk.modules() if isinstance(d, DropPath)], default=0.0)
               for blk in m.trunk.blocks]
        assert got == pytest.approx(want)


@pytest.mark.parametrize('family,arch', ARCHS, ids=_ids(ARCHS))
def test_arch_names(family, arch):
    table = FAMILIES[family].arch_zoo
    if family not in PAPER:  # timm's name is the arch
        assert table.resolve(arch.upper(), family) == table.resolve(f'{arch}.in1k', family) == arch
        return
    timm_name = table[arch].timm
    assert table.resolve(arch, family) == table.resolve(arch.upper(), family) == arch
    if timm_name:  # CaiT XS36, S48 and M24 have no timm name
        assert table.resolve(timm_name, family) == table.resolve(f'{timm_name}.fb_in1k',
                                                                  family) == arch



def test_docs_arch_tables_are_the_papers():
    """docs/backbones.md's tables: one row per arch, each the paper's (the reference above)."""
    import os
    import re

    from conftest import ROOT
    with open(os.path.join(ROOT, 'docs', 'backbones.md')) as f:
        rows = {m.group(1): [c.strip() for c in m.group(2).split('|')]
                for m in re.finditer(r'^\| `(\w+)` \|(.*)\|$', f.read(), flags=re.M)}
    assert sorted(rows) == sorted(arch for _, arch in PAPER_ARCHS)
    for family, arch in PAPER_ARCHS:
        paper, cells = PAPER[family](arch), rows[arch]
        third = paper['patch'] if family == 'XCiT' else paper['heads']
        assert [int(c) for c in cells[:3]] == [paper['embed_dim'], paper['depth'], third], arch
        assert tuple(int(t) for t in cells[3].split(',')) == paper['taps'], arch
        assert (float(cells[4]), float(cells[5])) == (pytest.approx(paper['drop']), paper['eps'])

# ------------------------------------------------------------------------------ forward
@_on(LIGHT)
@pytest.mark.parametrize('hw', SIZES, ids=lambda hw: f'{hw[0]}x{hw[1]}')
def test_output_shapes_strides_and_finite(backbone, hw):
    """One (B, C, H/s, W/s) map per stride, finite, for each input size: a full-depth forward of
    the arch (slow where ``_on`` builds a larger light arch at full size)."""
    family, arch, m = backbone
    with torch.no_grad():
        outs = m.eval()(torch.randn(2, 3, *hw))
    H, W = _padded(m, hw)  # zero-padded to a multiple of 32
    dim = _dim(family, arch)
    assert [tuple(o.shape) for o in outs] == [(2, dim, H // s, W // s) for s in (4, 8, 16, 32)]
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('family,arch', sorted(HEAVY), ids=_ids(sorted(HEAVY)))
def test_heavy_output_shapes_and_finite(family, arch):
    m = _heavy(family, arch).eval()
    with torch.no_grad():
        outs = m(torch.randn(1, 3, 50, 70))
    H, W = _padded(m, (50, 70))
    assert [tuple(o.shape) for o in outs] == [(1, _dim(family, arch), H // s, W // s)
                                              for s in (4, 8, 16, 32)]
    assert all(torch.isfinite(o).all() for o in outs)


def _no_gradient(m):
    return [n for n, p in m.named_parameters() if p.requires_grad and
            (p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0)]


def _trainable_copy(backbone) -> ColumnarBackbone:
    m = randomize_(_copy(backbone)).train()
    for d in m.modules():  # a dropped branch gets no gradient, by design
        if isinstance(d, DropPath):
            d.drop_prob = 0.0
    return m


def _step(m, x):
    out = m(x)
    sum(o.float().pow(2).mean() for o in out).backward()
    return out


@_on(LIGHT)
def test_every_trainable_parameter_gets_a_gradient(backbone):
    """Every trainable parameter gets a finite, non-zero gradient. ~1-5 s: a step at full depth."""
    m = _trainable_copy(backbone)
    _step(m, torch.randn(1, 3, 64, 96))
    assert not _no_gradient(m), _no_gradient(m)


@_on(CP)
def test_with_cp_gives_the_same_outputs_and_gradients(backbone):
    """with_cp gives the outputs and gradients of the plain model. ~1-8 s: two models' steps."""
    family, arch, _ = backbone
    ref = _trainable_copy(backbone)
    cp = FAMILIES[family](arch, drop_path_rate=0.0, with_cp=True).train()
    cp.load_state_dict(ref.state_dict())
    x = torch.randn(1, 3, 64, 64)
    outs = [_step(ref, x), _step(cp, x)]
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    cp_params = dict(cp.named_parameters())
    for n, p in ref.named_parameters():
        torch.testing.assert_close(cp_params[n].grad, p.grad, rtol=1e-5, atol=1e-7, msg=n)


# ------------------------------------------------------------------------------ parity with timm
def _timm_model(family, m: ColumnarBackbone) -> torch.nn.Module:
    """timm's own model of the arch, built as timm registers it (CaiT: at the backbone's
    position-embedding grid; timm's Cait runs only there)."""
    spec = m.arch_zoo[m.arch]
    if family not in PAPER:  # at any size, as the backbone builds it (BEiT: at its img_size)
        return timm.create_model(spec.timm, num_classes=0, **type(m).trunk_options,
                                 **({'img_size': m.img_size} if family == 'TimmBEiT' else {}))
    paper = PAPER[family](m.arch)
    if family == 'XCiT':
        return timm.create_model(spec.timm, num_classes=0)
    img_size = m.pos_embed_grid[0] * m.patch_size
    if spec.timm:
        return timm.create_model(spec.timm, num_classes=0, img_size=img_size)
    return Cait(img_size=img_size, embed_dim=paper['embed_dim'], depth=paper['depth'],
                num_heads=paper['heads'], num_classes=0)  # no timm name: timm's class


@_on(LIGHT)
def test_taps_equal_timms_own_model(backbone):
    """The taps equal timm's own model's intermediate outputs. ~1-3 s."""
    family = backbone[0]
    m = randomize_(_copy(backbone)).eval()
    ref = _timm_model(family, m)
    missing, unexpected = ref.load_state_dict(
        {k[6:]: v for k, v in m.state_dict().items() if k.startswith('trunk.')}, strict=False)
    assert not unexpected  # the same modules, the same shapes
    parts = tuple(f'{p}.' for p in m.classifier_parts) + m.classifier_parts
    assert missing and all(k.startswith(parts) for k in missing)
    # XCiT, ViT and EVA take any size; timm's Cait and Beit only their own grid (any other:
    # test_cait.py, test_timm_families.py)
    hw = {'CaiT': lambda: (m.pos_embed_grid[0] * 16,) * 2, 'TimmBEiT': lambda: m.img_size}.get(
        family, lambda: (64, 96))()
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        want = ref.eval().forward_intermediates(x, indices=list(m.out_indices), stop_early=True,
                                                intermediates_only=True)
        got = m._forward_taps(x)
    if m.tap_stride != m.patch_size:  # patch 14: the taps resampled to the 16-pixel grid
        want = [F.interpolate(w, size=got[0].shape[-2:], mode='bilinear', align_corners=False)
                for w in want]
        assert got[0].shape[-2:] == (hw[0] // 16, hw[1] // 16)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ checks
@_on(ALL)
def test_bad_inputs_refused(backbone):
    """Channels, a size under one patch and a 3-d tensor are refused before any computing
    (slow where ``_on`` builds a larger light arch at full size)."""
    m = backbone[2]  # refused before anything is computed (on the meta device too)
    patch = m.patch_size
    with pytest.raises(ValueError, match='3-channel images, got 1'):
        m(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match=f'smaller than one {patch}x{patch} patch'):
        m(torch.randn(1, 3, patch - 1, 64))
    with pytest.raises(ValueError, match=r'\(B, C, H, W\)'):
        m(torch.randn(3, 64, 64))


@pytest.mark.parametrize('family', FAMILIES)
def test_unknown_arch_refused_with_a_suggestion(family):
    fam = FAMILIES[family]
    typo = SMALLEST[family][:-1] + 'x'
    with pytest.raises(ValueError, match=rf"unknown arch '{typo}'.*Did you mean.*Valid"):
        fam(typo)
    with pytest.raises(ValueError, match='unknown arch'):
        fam(f'{family.lower()}_huge_99')
    with pytest.raises(TypeError, match=rf'{family}: arch must be a string, got int'):
        fam(12)
    with pytest.raises(ValueError, match=rf"{family}: unknown arch ''"):  # no name matches ''
        fam('')


@pytest.mark.parametrize('family', FAMILIES)
def test_bad_out_indices_refused(family):
    arch = SMALLEST[family]
    depth = FAMILIES[family].arch_zoo[arch].depth
    for bad in [(3, 5, 7, depth), (5, 3, 7, 11), (3, 3, 7, 11), (-1, 5, 7, 11)]:
        with pytest.raises(ValueError, match='out_indices'):
            _meta(family, arch, out_indices=bad)
    with pytest.raises(ValueError, match='one tap per level'):
        _meta(family, arch, out_indices=(3, 7, 11))


@pytest.mark.parametrize('family', FAMILIES)
def test_early_out_indices_prune_the_trunk(family):
    m = _meta(family, SMALLEST[family], out_indices=(1, 3, 5, 7))
    assert len(m.trunk.blocks) == 8 and m.out_indices == (1, 3, 5, 7)


# ------------------------------------------------------------------------------ training controls
# frozen_stages, norm_eval and with_cp of the smallest arch of every family, built through mmdet's
# and mmseg's registries: gradients, BatchNorm modes and statistics, checkpointing parity.
REGISTRIES = {'mmdet': MMDET_MODELS, 'mmseg': MMSEG_MODELS}
SMALLEST_ARCHS = [pytest.param(name, arch, id=name) for name, arch in SMALLEST.items()]


def _build(registry, family, arch, **kwargs) -> ColumnarBackbone:
    if (family, arch) in HEAVY:  # its first 4 blocks (BEiT's smallest is a base)
        kwargs.setdefault('out_indices', EARLY)
    m = REGISTRIES[registry].build(dict(type=family, arch=arch, **SMALL_GRID.get(family, {}),
                                        **kwargs))
    assert isinstance(m, ColumnarBackbone)
    # non-trivial statistics, so that a frozen BatchNorm's output differs from a training one's
    for bn in m.modules():
        if isinstance(bn, _BatchNorm):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return m


def _embedding(m: ColumnarBackbone):
    """What ``frozen_stages=0`` freezes: the patch and position embeddings, and the tokens that
    enter the blocks beside the patches (ViT's class, distillation and register tokens)."""
    mods = [m.trunk.patch_embed]
    pos = getattr(m.trunk, 'pos_embed', None)
    tokens = [getattr(m.trunk, t, None) for t in ('cls_token', 'dist_token', 'reg_token')]
    return mods + ([pos] if isinstance(pos, torch.nn.Module) else []), [
        p for p in (pos, *tokens) if isinstance(p, torch.nn.Parameter)]


def _frozen_and_trainable(m: ColumnarBackbone, k: int):
    emb_mods, emb_params = _embedding(m)
    frozen_mods = (emb_mods + list(m.trunk.blocks[:k])) if k >= 0 else []
    frozen = {id(p) for mod in frozen_mods for p in mod.parameters()}
    if k >= 0:
        frozen |= {id(p) for p in emb_params}
    names = dict((id(p), n) for n, p in m.named_parameters())
    return ({names[i] for i in frozen},
            {n for n, p in m.named_parameters() if id(p) not in frozen}, frozen_mods)


def _train_step(m, hw=(64, 96)):
    out = m(torch.randn(2, m.in_chans, *hw))
    sum(o.square().mean() for o in out).backward()
    return out


def _stats(m):
    return {n: b.clone() for n, b in m.named_buffers()}


@pytest.mark.parametrize('registry', REGISTRIES)
@pytest.mark.parametrize('family,arch', SMALLEST_ARCHS)
@pytest.mark.parametrize('k', [-1, 0, 3])
@pytest.mark.slow
def test_frozen_stages(registry, family, arch, k):
    """frozen_stages freezes the patch embedding and the first k blocks, through mmengine's train().
    ~1-6 s: a model's step."""
    m = _build(registry, family, arch, frozen_stages=k)
    m.train()  # what mmengine's loop does before training: freezing must survive it
    frozen, trainable, frozen_mods = _frozen_and_trainable(m, k)
    assert trainable and (k < 0) == (not frozen)
    params = dict(m.named_parameters())
    assert all(not params[n].requires_grad for n in frozen)
    assert all(params[n].requires_grad for n in trainable)

    frozen_bns = {id(bn) for mod in frozen_mods for bn in mod.modules() if isinstance(bn, _BatchNorm)}
    all_bns = [(n, bn) for n, bn in m.named_modules() if isinstance(bn, _BatchNorm)]
    assert all(bn.training == (id(bn) not in frozen_bns) for _, bn in all_bns)
    if k >= 0 and family == 'XCiT':
        assert frozen_bns  # the conv patch embedding's BatchNorms (and LPI's of frozen blocks)
    # the frozen modules are entirely in eval mode (drop path off too), the rest is training
    assert all(not sub.training for mod in frozen_mods for sub in mod.modules())
    assert m.trunk.blocks[-1].training and m.adapter.training

    before = _stats(m)
    _train_step(m)
    assert all(params[n].grad is None for n in frozen)
    assert all(params[n].grad is not None and torch.isfinite(params[n].grad).all()
               for n in trainable)
    after = _stats(m)
    frozen_bn_names = {n for n, bn in all_bns if id(bn) in frozen_bns}
    for n in before:
        owner = n.rsplit('.', 1)[0]
        if owner in frozen_bn_names:
            assert torch.equal(before[n], after[n]), f'{n} of a frozen BatchNorm changed'
        elif owner in {name for name, _ in all_bns} and n.endswith('running_mean'):
            assert not torch.equal(before[n], after[n]), f'{n} of a training BatchNorm unchanged'

    m.eval()
    assert not any(mod.training for mod in m.modules())
    m.train()
    assert all(bn.training == (id(bn) not in frozen_bns) for _, bn in all_bns)


@pytest.mark.parametrize('registry', REGISTRIES)
@pytest.mark.parametrize('family,arch', SMALLEST_ARCHS)
def test_norm_eval(registry, family, arch):
    """norm_eval keeps BatchNorm statistics while every parameter learns. ~1-5 s (BEiT: a base
    model)."""
    m = _build(registry, family, arch, norm_eval=True).train()
    bns = [bn for bn in m.modules() if isinstance(bn, _BatchNorm)]
    others = [mod for mod in m.modules() if not isinstance(mod, _BatchNorm)]
    assert all(not bn.training for bn in bns)
    assert all(mod.training for mod in others)  # LayerNorms, dropout, drop path: training
    before = _stats(m)
    _train_step(m)
    after = _stats(m)
    assert all(torch.equal(before[n], after[n]) for n in before)
    # norm_eval fixes statistics only: every parameter still learns (as in mmdet's ResNet)
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize('family,arch', SMALLEST_ARCHS)
@pytest.mark.parametrize('bad', [-2, 10 ** 3])
def test_frozen_stages_out_of_range_refused(family, arch, bad):
    with pytest.raises(ValueError, match='frozen_stages'):
        _build('mmdet', family, arch, frozen_stages=bad)


def _count_block_calls(m):
    calls = [0] * len(m.trunk.blocks)
    for i, blk in enumerate(m.trunk.blocks):
        blk.register_forward_hook(lambda *a, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize('family,arch', SMALLEST_ARCHS)
@pytest.mark.parametrize('k', [-1, 2])
@pytest.mark.slow
def test_with_cp_replays_drop_path_and_updates_statistics_once(family, arch, k):
    """with_cp gives the outputs and gradients of the plain model with drop path on, and BatchNorm
    statistics one update a step. ~3-10 s: two models and their steps per case."""
    kw = dict(frozen_stages=k, drop_path_rate=0.2)  # drop path: checkpointing must replay it
    ref = _build('mmdet', family, arch, **kw).train()
    cp = _build('mmseg', family, arch, with_cp=True, **kw).train()
    cp.load_state_dict(ref.state_dict())
    ref_calls, cp_calls = _count_block_calls(ref), _count_block_calls(cp)
    outs = []
    for m in (ref, cp):
        torch.manual_seed(1)
        outs.append(_train_step(m))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ref_p, cp_p = dict(ref.named_parameters()), dict(cp.named_parameters())
    for n, p in ref_p.items():
        if p.grad is None:
            assert cp_p[n].grad is None
        else:
            torch.testing.assert_close(cp_p[n].grad, p.grad, rtol=1e-5, atol=1e-7, msg=n)
    # BatchNorm statistics take one update per step, not a second one from the recomputation
    ref_b, cp_b = _stats(ref), _stats(cp)
    assert all(torch.equal(ref_b[n], cp_b[n]) for n in ref_b)
    # per-block checkpointing: every trainable block runs again in the backward pass
    assert ref_calls == [1] * len(ref_calls)
    first = max(k, 0)
    assert cp_calls == [1] * first + [2] * (len(cp_calls) - first)


@pytest.mark.parametrize('family,arch', SMALLEST_ARCHS)
@pytest.mark.slow
def test_with_cp_statistics_survive_mmengines_syncbn_revert(family, arch):
    """A single-process run of a SyncBN config: mmengine swaps every SyncBN for a new BN module."""
    from mmengine.model.utils import revert_sync_batchnorm
    ref = _build('mmdet', family, arch).train()
    cp = _build('mmdet', family, arch, with_cp=True,
                norm_cfg=dict(type='SyncBN', requires_grad=True))
    cp = revert_sync_batchnorm(cp).train()
    cp.load_state_dict(ref.state_dict())
    for m in (ref, cp):
        torch.manual_seed(1)
        _train_step(m)
    ref_b, cp_b = _stats(ref), _stats(cp)
    assert all(torch.equal(ref_b[n], cp_b[n]) for n in ref_b)


# ------------------------------------------------------------------------------ construction
def test_arguments_are_checked_into_one_frozen_description_before_building():
    """``parse_args`` checks every argument, builds nothing, and fixes what the backbone's
    attributes read; no family sets state on itself before its parent's constructor."""
    import ast
    import dataclasses
    import inspect
    import textwrap

    from deepvit_mm.models.backbones.arguments import ColumnarArgs
    args = XCiT.parse_args('xcit_nano_12_p16_224', out_strides=(8, 16, 32), qkv_cfg=dict(type='SNE'))
    assert isinstance(args, ColumnarArgs) and args.arch == 'nano_12_p16'
    assert (args.out_indices, args.kept_blocks, args.pad_to) == ((5, 7, 11), 12, 32)
    from deepvit_mm.models.backbones.xcit.model import XCiTArgs
    assert args.family == XCiTArgs(qkv_cfg=dict(type='SNE'))
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.arch = 'tiny_12_p16'
    with pytest.raises(ValueError, match=r'frozen_stages=13 must be'):
        XCiT.parse_args('nano_12_p16', frozen_stages=13)
    for fam in {*ColumnarBackbone.families, *(c for f in ColumnarBackbone.families
                                              for c in f.__mro__[1:]
                                              if issubclass(c, ColumnarBackbone))}:
        init = fam.__dict__.get('__init__')
        if init is None:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(init))).body[0].body
        calls = [i for i, st in enumerate(body) if 'super().__init__' in ast.unparse(st)]
        assert calls, fam
        early = [ast.unparse(st) for st in body[:calls[0]]
                 if any(isinstance(t, ast.Attribute) and ast.unparse(t.value) == 'self'
                        for node in ast.walk(st) if isinstance(node, (ast.Assign, ast.AnnAssign))
                        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
        assert not early, (fam.__name__, early)


# the families' own arguments, each built with its non-default value (every family with
# arguments of its own is named here: test_own_arguments_are_named)
OWN_ARGUMENTS = {
    'XCiT': dict(qkv_cfg=dict(type='SNE')),
    'CaiT': dict(window_size=2, global_blocks=(0, 3), img_size=96),
    'TimmViT': dict(window_size=2, global_blocks=(1,)),
}


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_own_arguments_are_a_typed_frozen_dataclass(family):
    """A family's own arguments are fields of a frozen dataclass (``ColumnarArgs.family``), read
    as attributes; one without any has None: no string-keyed dict."""
    import dataclasses
    fam = FAMILIES[family]
    arch = family_archs(fam)[0]
    own = OWN_ARGUMENTS.get(family, {})
    args = fam.parse_args(arch, **own)
    if not own:
        assert args.family is None
        return
    assert dataclasses.is_dataclass(args.family) and not isinstance(args.family, dict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(args.family, dataclasses.fields(args.family)[0].name, None)
    fields = {f.name: getattr(args.family, f.name) for f in dataclasses.fields(args.family)}
    for key, value in own.items():
        assert fields[key] == (tuple(value) if isinstance(value, tuple) else value), key


def test_with_family_refuses_a_string_keyed_dict():
    """A family's own arguments go in as its dataclass; a dict (or the class itself) is refused
    with what to pass instead."""
    from deepvit_mm.models.backbones.windows import WindowArgs
    args = FAMILIES['XCiT'].parse_args(family_archs(FAMILIES['XCiT'])[0])
    for bad in ({'window_size': 2}, WindowArgs):
        with pytest.raises(TypeError, match="instance of the family's own dataclass"):
            args.with_family(bad)
    assert args.with_family(WindowArgs(2, (1,))).family.window_size == 2


def test_own_arguments_are_named():
    """Every family whose constructor takes keywords of its own is in OWN_ARGUMENTS."""
    import inspect
    base = set(inspect.signature(ColumnarBackbone.parse_args).parameters)
    for name, fam in FAMILIES.items():
        own = {p for c in fam.__mro__ if 'parse_args' in vars(c)
               for p, par in inspect.signature(c.parse_args).parameters.items()
               if par.kind is not par.VAR_KEYWORD} - base
        assert own == set(OWN_ARGUMENTS.get(name, {})), name


def test_windowed_families_share_their_windows():
    """``window_size``, ``global_blocks`` and the taps of the token grid are written once
    (``windows.Windowed``): every family taking ``window_size`` has them from there, and its own
    arguments are a ``windows.WindowArgs``."""
    from deepvit_mm.models.backbones.windows import WindowArgs, Windowed
    windowed = [name for name, own in OWN_ARGUMENTS.items() if 'window_size' in own]
    assert windowed
    for name, fam in FAMILIES.items():
        assert issubclass(fam, Windowed) == (name in windowed), name
        if name not in windowed:
            continue
        again = [(c.__name__, a) for c in fam.__mro__ if c is not Windowed
                 for a in ('window_size', 'global_blocks', '_grid_taps') if a in vars(c)]
        assert not again, again
        args = fam.parse_args(family_archs(fam)[0], **OWN_ARGUMENTS[name])
        assert isinstance(args.family, WindowArgs)
        assert [args.family.window_of(i) for i in range(4)] == \
            [0 if i in OWN_ARGUMENTS[name]['global_blocks'] else 2 for i in range(4)]


def test_the_families_register_themselves():
    """Every family (a subclass with an arch table of its own) is in ``ColumnarBackbone.families``,
    the base itself is not."""
    assert ColumnarBackbone not in ColumnarBackbone.families
    assert {'XCiT', 'CaiT', 'TimmViT', 'TimmEVA', 'TimmBEiT'} <= set(FAMILIES)


def test_the_docs_family_example_builds_and_runs(monkeypatch):
    """docs/backbones.md's "A family of your own": its code defines a family that builds, checks
    its own argument and gives the four maps."""
    import builtins
    import os
    import re
    import sys
    import types

    from conftest import ROOT
    monkeypatch.setattr(ColumnarBackbone, 'families', list(ColumnarBackbone.families))
    with open(os.path.join(ROOT, 'docs', 'backbones.md')) as f:
        section = f.read().split('## A family of your own', 1)[1]
    code = re.search(r'```python\n(.*?)```', section, flags=re.S).group(1)
    # run as a user's module is: a module of its own (a dataclass of a namespace that no module
    # holds would be made in builtins' namespace, and leave it holding itself)
    module = types.ModuleType('docs_family_example')
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, 'docs/backbones.md', 'exec'), module.__dict__)
    assert '__builtins__' not in vars(builtins)
    family = module.PlainDeiT
    with pytest.raises(TypeError, match='qkv_bias must be True or False'):
        family('tiny', qkv_bias='no')
    m = family('deit_tiny_patch16_224', qkv_bias=False, out_indices=EARLY).eval()
    assert m.args.family.qkv_bias is False and m.trunk.blocks[0].attn.qkv.bias is None
    with torch.no_grad():
        outs = m(torch.randn(1, 3, 64, 96))
    assert [tuple(o.shape) for o in outs] == [(1, 192, 64 // s, 96 // s) for s in (4, 8, 16, 32)]
