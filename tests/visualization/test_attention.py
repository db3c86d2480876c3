"""Attention maps (deepvit_mm.visualization.attention, tools/analysis/attention_vis.py).

* every family's maps equal timm's own attention (fused attention off,
  ``timm.utils.AttentionExtract``), whatever timm's fused-attention setting (or CaiT's query
  chunks) was when they were taken: classifiers (ViT, DeiT III, DINOv2 with registers, EVA-02,
  BEiT, CaiT's trunk, CaiT's and XCiT's class attention) and our dense backbones (CaiT and ViT
  with windows, EVA-02, BEiT); one module's (``attention_probs``) too;
* aligned: a query patch whose attention is built to peak on itself lands on the image where
  ``--patch`` put it, through a classifier's resize and padding (patch 14 and 16, BEiT's fixed
  grid) and a detector's and a segmentor's test pipeline, preprocessor and backbone padding;
* DINO's top share of attention mass;
* the tool: files, arrays, the pretrained classifier in place of a detector's missing class
  attention, and bad input refused in one line with nothing written.
"""
import os
import subprocess
import sys

import mmcv
import numpy as np
import pytest
import timm
import torch
import torch.nn as nn
from conftest import DEMO_DET, DEMO_SEG, EARLY, ROOT, build_model, randomize_
from mmengine.config import Config
from timm.utils import AttentionExtract

from deepvit_mm import CaiT, TimmBEiT, TimmEVA, TimmViT
from deepvit_mm.visualization import (
    AttentionDrawer,
    attention_maps,
    attention_probs,
    attention_sites,
)
from deepvit_mm.visualization.attention import AttentionError, AttentionMap, top_mass_mask

TOOL = os.path.join(ROOT, 'tools', 'analysis', 'attention_vis.py')
# float rounding: fused and unfused attention, and the order of the matmuls, differ by ~1e-7
TOL = 1e-5


def _perturb_(model: nn.Module) -> nn.Module:
    """Every parameter moved off its init (BEiT's relative position bias table and CaiT's
    talking-heads mixing start at zeros and identities, where leaving them out would not show)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return randomize_(model)


def _set_fused(model: nn.Module, fused: bool) -> None:
    for m in model.modules():
        if hasattr(m, 'fused_attn'):
            m.fused_attn = fused


def _timm_attention(model: nn.Module, x: torch.Tensor, names) -> dict:
    """timm's own attention of the modules ``names``: fused attention off, the weights
    ``attn_drop`` passes on (``AttentionExtract``'s hooks)."""
    _set_fused(model, False)
    with torch.no_grad():
        out = AttentionExtract(model, names=[n + '.attn_drop' for n in names], method='hook')(x)
    return {n: out[n + '.attn_drop'][0] for n in names}


def _rows(ref: torch.Tensor, grid, query: str, cell=(1, 2)) -> torch.Tensor:
    """The query's row of timm's ``(heads, n, N)`` attention over the patches, as a grid."""
    gh, gw = grid
    prefix = ref.shape[-1] - gh * gw
    row = 0 if query in ('cls', 'class') else prefix + cell[0] * gw + cell[1]
    return ref[:, row, prefix:].reshape(-1, gh, gw)


def _compare(model, run, x, sites, query) -> float:
    """Our maps with fused attention on and off, against timm's; the largest difference."""
    _set_fused(model, True)
    fused = attention_maps(model, run, sites, query, (1, 2))
    _set_fused(model, False)
    unfused = attention_maps(model, run, sites, query, (1, 2))
    ref = _timm_attention(model, x, [s.name for s in sites])
    worst = 0.0
    for s, a, b in zip(sites, fused, unfused):
        want = _rows(ref[s.name], a.grid, query)
        assert a.heads.shape == want.shape
        worst = max(worst, (a.heads - want).abs().max().item(),
                    (b.heads - want).abs().max().item())
    return worst


# (family, timm name, what timm builds it with, the queries it has): every family at its
# smallest, two blocks, a non-square input (48 x 80) that is not square in patches either
CLASSIFIERS = [
    ('ViT', 'vit_tiny_patch16_224', {}, ('cls', 'patch')),
    ('DeiT III', 'deit3_small_patch16_224', {}, ('cls', 'patch')),
    ('DINOv2 registers', 'vit_small_patch14_reg4_dinov2', {}, ('cls', 'patch')),
    ('EVA-02', 'test_eva', {}, ('cls', 'patch')),
    ('BEiT', 'test_beit', dict(img_size=(48, 80)), ('cls', 'patch')),
    ('CaiT', 'cait_xxs24_224', dict(img_size=(48, 80)), ('patch', 'class')),
    ('XCiT', 'xcit_nano_12_p16_224', {}, ('class',)),
]


@pytest.mark.parametrize('family,name,kwargs,queries', CLASSIFIERS, ids=[c[0] for c in CLASSIFIERS])
def test_classifier_attention_equals_timms(family, name, kwargs, queries):
    dynamic = {} if family in ('BEiT', 'CaiT', 'XCiT') else \
        dict(dynamic_img_size=True, dynamic_img_pad=True)
    model = _perturb_(timm.create_model(name, pretrained=False, depth=2, **dynamic, **kwargs))
    model.eval()
    x = torch.randn(1, 3, 48, 80)
    sites = attention_sites(model)
    for query in queries:
        chosen = [s for s in sites if (s.kind == 'class') == (query == 'class')]
        assert len(chosen) == 2 and all(s.kind in ('self', 'class') for s in chosen)
        worst = _compare(model, lambda: model(x), x, chosen, query)
        print(f'{family} classifier, {query}: max |ours - timm| = {worst:.1e}')  # docs' figure
        assert worst < TOL, (family, query)


def _backbone(kind):
    if kind == 'CaiT windows':
        return CaiT('xxs24', out_indices=EARLY, window_size=3, global_blocks=(1, 3),
                    query_chunks=False)
    if kind == 'ViT':
        return TimmViT('vit_tiny_patch16_224', out_indices=EARLY)
    if kind == 'ViT windows':
        return TimmViT('vit_tiny_patch16_224', out_indices=EARLY, window_size=3,
                       global_blocks=(1, 3))
    if kind == 'EVA-02':
        return TimmEVA('test_eva', out_indices=EARLY)
    return TimmBEiT('test_beit', out_indices=EARLY, img_size=96)


@pytest.mark.parametrize('kind', ['CaiT windows', 'ViT', 'ViT windows', 'EVA-02', 'BEiT'])
def test_backbone_patch_attention_equals_timms(kind):
    """Inside a detector's backbone: the global blocks' patch rows, the input padded by the
    backbone (50 x 90 -> 64 x 96) and, with windows, the windowed blocks refused by name."""
    backbone = _perturb_(_backbone(kind)).eval()
    x = torch.randn(1, 3, 50, 90)
    sites = [s for s in attention_sites(backbone) if s.kind == 'self']
    assert [s.index for s in sites] == [0, 1, 2, 3]
    global_ = [s for s in sites if not s.window_size]
    assert [s.index for s in global_] == ([1, 3] if 'windows' in kind else [0, 1, 2, 3])
    worst = _compare(backbone, lambda: backbone(x), x, global_, 'patch')
    print(f'{kind} backbone, patch: max |ours - timm| = {worst:.1e}')  # docs' figure
    assert worst < TOL
    maps = attention_maps(backbone, lambda: backbone(x), global_[-1:], 'patch', (1, 2))
    # the grid over the backbone's padded input (BEiT's: its 96 x 96 grid), patch 14's padded
    # further by the patch embedding
    p, (H, W) = backbone.patch_size, backbone._padded_size(50, 90)
    grid = (-(-H // p), -(-W // p))
    assert maps[0].grid == grid and maps[0].pad_shape == (grid[0] * p, grid[1] * p)
    if 'windows' in kind:
        with pytest.raises(AttentionError, match='attends within 3x3 windows'):
            attention_maps(backbone, lambda: backbone(x), sites[:1], 'patch', (1, 2))


def test_xcas_channel_attention_is_refused_with_the_feature_maps_tool():
    model = timm.create_model('xcit_nano_12_p16_224', pretrained=False, depth=1).eval()
    sites = attention_sites(model)
    assert [s.kind for s in sites] == ['channel', 'class', 'class']
    x = torch.randn(1, 3, 32, 48)
    with pytest.raises(AttentionError, match=r'over channels .*featmap_vis\.py'):
        attention_maps(model, lambda: model(x), sites[:1], 'patch', (0, 0))


def test_query_chunks_are_off_while_the_maps_are_taken():
    """A CaiT backbone whose talking heads go by query chunks (which never form the whole map):
    the chosen blocks run timm's attention for the maps, their chunks set back after."""
    backbone = _perturb_(CaiT('xxs24', out_indices=EARLY, query_chunks=False)).eval()
    x = torch.randn(1, 3, 50, 90)
    sites = [s for s in attention_sites(backbone) if s.kind == 'self'][:2]
    ref = _timm_attention(backbone, x, [s.name for s in sites])
    for s in sites:
        s.module.query_chunk = 4  # rows a step, fewer than the 24 patches
    maps = attention_maps(backbone, lambda: backbone(x), sites, 'patch', (1, 2))
    assert all(s.module.query_chunk == 4 for s in sites)
    for s, m in zip(sites, maps):
        assert (m.heads - _rows(ref[s.name], m.grid, 'patch')).abs().max() < TOL


def test_attention_probs_of_one_module_are_timms():
    """One module's weights from what it receives, with its fused attention on (and left on), as
    timm's own; a windowed block's grid refused."""
    model = _perturb_(timm.create_model('vit_tiny_patch16_224', pretrained=False, depth=1,
                                        dynamic_img_size=True)).eval()
    x = torch.randn(1, 3, 48, 80)
    attn, got = model.blocks[0].attn, {}
    handle = attn.register_forward_pre_hook(lambda m, args: got.setdefault('x', args[0]))
    ref = _timm_attention(model, x, ['blocks.0.attn'])['blocks.0.attn']
    handle.remove()
    _set_fused(model, True)
    probs = attention_probs(attn, got['x'], [0, 5])
    assert probs.shape == (1, 3, 2, 16) and attn.fused_attn
    assert (probs[0] - ref[:, [0, 5]]).abs().max() < TOL
    windowed = [s for s in attention_sites(_backbone('ViT windows')) if s.window_size][0]
    with pytest.raises(AttentionError, match='attends within 3x3 windows'):
        attention_probs(windowed.module, torch.randn(1, 4, 6, 192))


# ------------------------------------------------------------------------------ alignment
def _peak_on_like_patches_(trunk: nn.Module) -> None:
    """Block 0's attention made to peak on the patches as bright as the query: each token is
    ``v a + b`` (``v`` its patch's mean intensity, ``a`` and ``b`` fixed orthogonal patterns
    with zero mean), its block norm keeps the direction ``(v, 1)``, and ``q = 2k``: the logits
    are the cosine of ``(v_i, 1)`` and ``(v_j, 1)``, largest where ``v_j = v_i``."""
    C = trunk.embed_dim
    a = torch.tensor([1., -1.]).repeat(C // 2)
    b = torch.tensor([1., 1., -1., -1.]).repeat(C // 4)
    with torch.no_grad():
        proj = trunk.patch_embed.proj
        proj.weight.copy_(a.view(C, 1, 1, 1).expand_as(proj.weight) / proj.weight[0].numel())
        proj.bias.copy_(b)
        for name in ('pos_embed', 'cls_token', 'reg_token'):
            p = getattr(trunk, name, None)
            if isinstance(p, nn.Parameter):
                p.zero_()
        blk = trunk.blocks[0]
        blk.norm1.weight.fill_(1)
        blk.norm1.bias.zero_()
        attn = blk.attn
        attn.qkv.weight.zero_()
        attn.qkv.weight[:C] = 2 * torch.eye(C)
        attn.qkv.weight[C:2 * C] = torch.eye(C)
        for p in (attn.qkv.bias, getattr(attn, 'q_bias', None), getattr(attn, 'v_bias', None),
                  getattr(attn, 'relative_position_bias_table', None)):
            if p is not None:
                p.zero_()


SPOT = (slice(70, 96), slice(104, 136))  # rows, columns of a 100 x 150 image, near its corner


def _spot_image(path) -> str:
    img = np.zeros((100, 150, 3), np.uint8)
    img[SPOT] = 255
    mmcv.imwrite(img, str(path))
    return str(path)


def _assert_peak_in_spot(pictures):
    mean = next(p for p in pictures if p.name.endswith('_mean'))
    assert mean.array.shape == (100, 150)
    y, x = np.unravel_index(np.argmax(mean.array), mean.array.shape)
    assert SPOT[0].start <= y < SPOT[0].stop and SPOT[1].start <= x < SPOT[1].stop, (y, x)
    # most of the map is on the spot: a map stretched over the padding would move it off
    inside = mean.array[SPOT].sum() / mean.array.sum()
    assert inside > 0.5, inside


def _cells_by_hand(grid, patch, img_shape, ori_shape) -> np.ndarray:
    """The cell each pixel of the original image was computed from: its centre scaled to the
    network input, divided by the patch (the padding's cells are never reached)."""
    ys = (np.arange(ori_shape[0]) + 0.5) * img_shape[0] / ori_shape[0] // patch
    xs = (np.arange(ori_shape[1]) + 0.5) * img_shape[1] / ori_shape[1] // patch
    return ys.astype(int)[:, None] * grid[1] + xs.astype(int)[None, :]


@pytest.mark.parametrize('grid,patch,img_shape,ori_shape', [
    ((10, 14), 16, (149, 224), (100, 150)),   # a ViT-B/16 classifier's input: padded to 160
    ((25, 37), 14, (345, 518), (100, 150)),   # DINOv2's 518 input, patch 14: padded to 350
    ((14, 14), 16, (149, 224), (100, 150)),   # BEiT's fixed 224 grid: a third padding
    ((14, 19), 14, (171, 256), (100, 150)),   # EVA-02 in a detector: 192 x 256, then 196 x 266
])
def test_each_cell_lands_on_the_pixels_it_was_computed_from(grid, patch, img_shape, ori_shape):
    """Every cell of a map with a value a cell (nearest resizing) lands on the original pixels
    whose centre it covers (every pixel here; 1 % is allowed on cells' edges, where two resizings
    may round either way); a map stretched over its padding puts 16-90 % on another cell."""
    cells = torch.arange(grid[0] * grid[1], dtype=torch.float32).reshape(1, *grid)
    m = AttentionMap(site=None, label='', tag='', heads=cells, patch_size=(patch, patch))
    got = m.aligned(img_shape, ori_shape, mode='nearest-exact')['head0']
    want = _cells_by_hand(grid, patch, img_shape, ori_shape)
    assert (got == want).mean() > 0.99
    stretched = _cells_by_hand(grid, patch, m.pad_shape, ori_shape)
    assert (stretched == want).mean() < 0.9  # the check above can fail


@pytest.mark.parametrize('name,img_shape,pad_shape', [
    ('vit_tiny_patch16_224', (149, 224), (160, 224)),
    ('vit_small_patch14_reg4_dinov2', (149, 224), (154, 224)),
    ('test_beit', (149, 224), (224, 224)),
])
def test_a_classifiers_patch_attention_lands_where_the_patch_is(tmp_path, name, img_shape,
                                                                pad_shape):
    """Patch 16 and patch 14 (4 register tokens) resized to 224 and padded to the patch; BEiT
    padded to its fixed 224 x 224 grid (a third of it padding)."""
    model = timm.create_model(name, pretrained=False)
    _peak_on_like_patches_(model)
    torch.save(model.state_dict(), tmp_path / 'model.pth')
    drawer = AttentionDrawer(name, str(tmp_path / 'model.pth'), attention='patch', blocks=[0],
                             input_size=224, device='cpu')
    result = drawer.compute(_spot_image(tmp_path / 'spot.png'), patch='120,83')
    assert result.img_shape == img_shape and result.maps[0].pad_shape == pad_shape
    _assert_peak_in_spot(drawer(str(tmp_path / 'spot.png'), patch='120,83'))
    # the same query made from a dark patch attends elsewhere: the test can fail
    dark = drawer(str(tmp_path / 'spot.png'), patch='20,20')
    y, x = np.unravel_index(np.argmax(dark[-1].array), (100, 150))
    assert not (SPOT[0].start <= y < SPOT[0].stop and SPOT[1].start <= x < SPOT[1].stop)


def _vit_dense(root, base: str):
    """A demo config with a 4-block ViT-Ti/16 backbone, block 0 made to attend to like patches,
    and its checkpoint."""
    config = root / 'vit_dense.py'
    config.write_text(f"_base_ = {base!r}\nmodel = dict(backbone=dict(_delete_=True, "
                      "type='TimmViT', arch='vit_tiny_patch16_224', out_indices=(0, 1, 2, 3), "
                      "init_cfg=None), neck=dict(in_channels=[192] * 4))\n")
    torch.manual_seed(0)
    model = build_model(Config.fromfile(str(config)))
    _peak_on_like_patches_(model.backbone.trunk)
    torch.save({'state_dict': model.state_dict()}, root / 'vit_dense.pth')
    return str(config), str(root / 'vit_dense.pth')


@pytest.mark.parametrize('base,img_shape,pad_shape', [
    # the detection demo: 100 x 150 -> 171 x 256, padded to 32 by its preprocessor (192 x 256)
    (DEMO_DET, (171, 256), (192, 256)),
    # the segmentation demo: 100 x 150 -> 256 x 384 (mmseg's Resize), a multiple of 32 as it is
    (DEMO_SEG, (256, 384), (256, 384)),
], ids=['detector', 'segmentor'])
def test_a_dense_models_patch_attention_lands_where_the_patch_is(tmp_path, base, img_shape,
                                                                 pad_shape):
    """Through the config's test pipeline and data preprocessor, and the backbone's padding."""
    config, ckpt = _vit_dense(tmp_path, base)
    drawer = AttentionDrawer(config, ckpt, blocks=[0], device='cpu')
    assert drawer.kind == 'patch'
    result = drawer.compute(_spot_image(tmp_path / 'spot.png'), patch='120,83')
    assert result.img_shape == img_shape and result.maps[0].pad_shape == pad_shape
    _assert_peak_in_spot(drawer(str(tmp_path / 'spot.png'), patch='120,83'))


# ------------------------------------------------------------------------------ DINO's threshold
def test_top_mass_keeps_the_fewest_cells_holding_the_share():
    maps = torch.tensor([[[0.5, 0.25], [0.15, 0.1]],
                         [[0.1, 0.1], [0.1, 0.7]]])
    keep = top_mass_mask(maps, 0.6)
    # 0.5 + 0.25 hold 75 %, 0.5 alone less than 60 %; 0.7 alone holds 70 %
    assert keep.tolist() == [[[True, True], [False, False]], [[False, False], [False, True]]]
    # as a share of each map's mass: scaled maps keep the same cells
    assert torch.equal(top_mass_mask(maps * 7, 0.6), keep)
    # the padding's cells (outside `valid`) are neither counted nor kept
    padded = torch.tensor([[[0.1, 0.9], [0.0, 0.0]]])
    assert top_mass_mask(padded, 0.6, valid=(2, 1)).tolist() == [[[True, False], [False, False]]]
    with pytest.raises(AttentionError, match='negative weights'):
        top_mass_mask(torch.tensor([[[-0.1, 1.1]]]), 0.6)


# ------------------------------------------------------------------------------ the tool
@pytest.fixture(scope='module')
def xcit_classifier(tmp_path_factory):
    """An XCiT-N12/16 classifier's checkpoint in the official release layout (``{'model': ...}``,
    ``pos_embeder``, fused class-attention qkv), and an image."""
    from conftest import official_xcit_state_dict
    root = tmp_path_factory.mktemp('xcit_cls')
    torch.manual_seed(0)
    model = _perturb_(timm.create_model('xcit_nano_12_p16_224', pretrained=False))
    torch.save(official_xcit_state_dict(model), root / 'xcit_n12_p16.pth')
    img = (np.random.RandomState(0).rand(60, 100, 3) * 255).astype(np.uint8)
    mmcv.imwrite(img, str(root / 'img.png'))
    return root


def test_tool_draws_every_class_attention_layer_and_head(xcit_classifier, tmp_path, in_process):
    out = tmp_path / 'out'
    r = in_process(TOOL, xcit_classifier / 'img.png', 'xcit_nano_12_p16_224',
                   xcit_classifier / 'xcit_n12_p16.pth', '--threshold', '0.6', '--save-arrays',
                   '--out-dir', out, '--device', 'cpu', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(out))
    # 2 layers x (4 heads + mean) x (map, top 60 %) x (png, npz)
    assert len(names) == 2 * 5 * 2 * 2
    assert 'img_class_attn1_mean_top60_0.npz' in names and 'img_class_attn0_head3_0.png' in names
    maps = {h: np.load(out / f'img_class_attn1_{h}_0.npz')['map']
            for h in ('head0', 'head1', 'head2', 'head3', 'mean')}
    assert all(m.shape == (60, 100) and m.dtype == np.float32 for m in maps.values())
    np.testing.assert_allclose(maps['mean'], np.mean([maps[f'head{i}'] for i in range(4)], 0),
                               atol=1e-6)
    top = np.load(out / 'img_class_attn1_mean_top60_0.npz')
    assert top['mask'].dtype == bool and 0 < top['mask'].mean() < 1
    np.testing.assert_array_equal(top['map'], np.where(top['mask'], maps['mean'], 0))
    assert mmcv.imread(str(out / 'img_class_attn1_mean_0.png')).shape == (60, 100, 3)


def test_a_detector_without_class_attention_takes_the_named_classifier(tmp_path, logged):
    """The detection demo (XCiT-N12/8, no class-attention blocks) refuses in one line, then with
    ``--classifier`` draws the classifier's class attention, labelled as the pretrained
    classifier's."""
    torch.manual_seed(0)
    det = build_model(Config.fromfile(DEMO_DET))
    torch.save({'state_dict': det.state_dict()}, tmp_path / 'det.pth')
    cls = timm.create_model('xcit_nano_12_p8_224', pretrained=False)
    torch.save(cls.state_dict(), tmp_path / 'cls.pth')
    with pytest.raises(AttentionError, match=r'no class-attention blocks .*--classifier'):
        AttentionDrawer(DEMO_DET, str(tmp_path / 'det.pth'), attention='class', device='cpu')
    with pytest.raises(AttentionError, match=r"attend over channels .*featmap_vis\.py"):
        AttentionDrawer(DEMO_DET, str(tmp_path / 'det.pth'), device='cpu')
    notes = []
    drawer = AttentionDrawer(DEMO_DET, str(tmp_path / 'det.pth'), attention='class',
                             classifier=str(tmp_path / 'cls.pth'), device='cpu',
                             log=notes.append)
    assert drawer.name == 'pretrained classifier xcit_nano_12_p8_224'
    assert len(notes) == 1 and 'no class-attention blocks' in notes[0]
    img = (np.random.RandomState(1).rand(40, 56, 3) * 255).astype(np.uint8)
    mmcv.imwrite(img, str(tmp_path / 'img.png'))
    pictures = drawer(str(tmp_path / 'img.png'))
    assert [p.name for p in pictures][:2] == ['img_class_attn0_head0', 'img_class_attn0_head1']
    assert all(p.array.shape == (40, 56) for p in pictures)


@pytest.mark.parametrize('args,message', [
    (['missing.png', 'vit_tiny_patch16_224'], "image not found: 'missing.png'"),
    (['ckpt.pth', 'vit_tiny_patch16_224'], "cannot read image 'ckpt.pth'"),
    (['img.png', 'vit_tiny_patch16_224', '--block', '12'],
     'vit_tiny_patch16_224 has no block 12: its blocks are 0-11'),
    (['img.png', 'vit_tiny_patch16_224', '--attention', 'class'],
     'vit_tiny_patch16_224 has no class-attention layers'),
    (['img.png', 'xcit_nano_12_p16_224', '--attention', 'cls'], 'attend over channels'),
    (['img.png', 'vit_tiny_patch16_224', '--attention', 'patch', '--patch', '100,10'],
     '--patch 100,10: outside the 64x48 image'),
    (['img.png', 'vit_tiny_patch16_224', '--threshold', '60'], '--threshold 60.0: give the share'),
    (['img.png', 'vit_tinny_patch16_224'], "did you mean 'vit_tiny_patch16_224'"),
])
def test_tool_refuses_bad_input_in_one_line_writing_nothing(tmp_path, in_process, args, message):
    model = timm.create_model(args[1].replace('tinny', 'tiny'), pretrained=False)
    torch.save(model.state_dict(), tmp_path / 'ckpt.pth')
    mmcv.imwrite(np.zeros((48, 64, 3), np.uint8), str(tmp_path / 'img.png'))
    r = in_process(TOOL, args[0], args[1], 'ckpt.pth', *args[2:], '--out-dir', 'out',
                   '--device', 'cpu', cwd=tmp_path)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / 'out').exists()


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path, xcit_classifier):
    with pytest.raises(AttentionError, match=r'does not fit vit_tiny_patch16_224: \d+ of the '):
        AttentionDrawer('vit_tiny_patch16_224', str(xcit_classifier / 'xcit_n12_p16.pth'),
                        device='cpu')


@pytest.mark.slow
def test_tool_runs_as_a_process(xcit_classifier, tmp_path):
    """The tool started as users start it, headless (no DISPLAY). ~10 s: mmdet's and mmseg's
    imports in a new process."""
    env = dict(os.environ)
    env.pop('DISPLAY', None)
    r = subprocess.run([sys.executable, TOOL, str(xcit_classifier / 'img.png'),
                        'xcit_nano_12_p16_224', str(xcit_classifier / 'xcit_n12_p16.pth'),
                        '--block', '1', '--out-dir', str(tmp_path / 'out'), '--device', 'cpu'],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / 'out')) == [
        f'img_class_attn1_{h}_0.png' for h in ('head0', 'head1', 'head2', 'head3', 'mean')]
