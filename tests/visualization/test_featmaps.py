"""Feature maps over the image (deepvit_mm.visualization.featmaps, tools/analysis/featmap_vis.py):
each level cropped to the cells that see the image before it is resized to it, for non-square
images, backbones that pad further inside, every family, mmdet and mmseg configs; the tool's
pictures, arrays and one-line refusals."""
import functools
import inspect
import math
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import DEMO_DET, DEMO_SEG, EARLY, ROOT, SMALL_GRID
from mmengine.model import BaseModule

from deepvit_mm.visualization import (
    FeatmapExtractor,
    VisualizationError,
    align_to_image,
    visualize_featmaps,
)
from deepvit_mm.visualization.align import valid_grid

TOOL = os.path.join(ROOT, 'tools', 'analysis', 'featmap_vis.py')


# ------------------------------------------------------------------------------ align_to_image
@pytest.mark.parametrize('stride', [None, 4])
def test_align_keeps_the_valid_cells_only_on_each_axis(stride):
    """A 24 x 40 map over a 96 x 160 input holding a 66 x 105 image (stride 4 each way): its
    valid cells, 17 x 27, hold 1 and the padding's 100; the aligned map is all 1 (no padding
    leaks in), and a cell's value lands on the original image's pixels it was computed from."""
    assert valid_grid((24, 40), (66, 105), (96, 160), stride) == (17, 27)
    m = torch.full((2, 24, 40), 100.)
    m[:, :17, :27] = 1
    out = align_to_image(m, (66, 105), (96, 160), (88, 140), stride)
    assert out.shape == (2, 88, 140) and torch.allclose(out, torch.ones_like(out))
    # one hot cell: (row 10, column 20) covers resized pixels 40-44 x 80-84, original 53-59 x
    # 107-112 (x 4/3); the aligned map peaks there
    m = torch.zeros(24, 40)
    m[:17, :27] = 0
    m[10, 20] = 1
    out = align_to_image(m, (66, 105), (96, 160), (88, 140), stride)
    y, x = np.unravel_index(int(out.argmax()), out.shape)
    assert 53 <= y <= 59 and 107 <= x <= 112, (y, x)


def test_align_takes_a_stride_beyond_the_input():
    """A backbone that pads further inside (BEiT: to its position grid) has more cells than the
    input: with its stride the valid cells are ceil(image / stride), not a share of the grid."""
    assert valid_grid((24, 24), (40, 60), (64, 64), stride=4) == (10, 15)
    m = torch.full((24, 24), 100.)
    m[:10, :15] = 1
    assert torch.allclose(align_to_image(m, (40, 60), (64, 64), (40, 60), stride=4),
                          torch.ones(40, 60))


def test_align_refuses_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match='larger than pad_shape'):
        valid_grid((4, 4), (70, 60), (64, 64))
    with pytest.raises(ValueError, match=r'give \(C, h, w\) or \(h, w\)'):
        align_to_image(torch.zeros(1, 1, 4, 4), (4, 4), None, (4, 4))


# ------------------------------------------------------------------------------ a model whose
# maps are known: the image's brightness average-pooled at strides 4-32
class FeatmapTestPool(BaseModule):
    """The input's channel mean, average-pooled at each stride; ``grid``: zero-padded first to
    that ``(h, w)`` (as BEiT pads to its position grid)."""
    out_strides = (4, 8, 16, 32)

    def __init__(self, grid=None, init_cfg=None):
        super().__init__(init_cfg)
        self.grid = grid
        self.unused = torch.nn.Parameter(torch.zeros(1))  # a checkpoint with one tensor

    def forward(self, x):
        x = x.mean(1, keepdim=True)
        if self.grid:
            x = F.pad(x, (0, self.grid[1] - x.shape[-1], 0, self.grid[0] - x.shape[-2]))
        return tuple(F.avg_pool2d(x, s, ceil_mode=True) for s in self.out_strides)


def _register():
    from mmdet.registry import MODELS
    MODELS.register_module(module=FeatmapTestPool, force=True)


_register()
# the same class for a tool started as a process (the config's custom_imports)
POOL_MODULE = ('import torch\nimport torch.nn.functional as F\nfrom mmdet.registry import MODELS\n'
               'from mmengine.model import BaseModule\n\n\n' + inspect.getsource(FeatmapTestPool)
               + '\n\nMODELS.register_module(module=FeatmapTestPool, force=True)\n')

POOL_CONFIG = """
default_scope = 'mmdet'
model = dict(
    type='RetinaNet',
    data_preprocessor=dict(type='DetDataPreprocessor', mean=[0, 0, 0], std=[1, 1, 1],
                           bgr_to_rgb=False, pad_size_divisor=32),
    backbone=dict(type='FeatmapTestPool', grid={grid}),
    neck=dict(type='FPN', in_channels=[1, 1, 1, 1], out_channels=4, num_outs=5),
    bbox_head=dict(
        type='RetinaHead', num_classes=1, in_channels=4, feat_channels=4, stacked_convs=1,
        anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4, scales_per_octave=1,
                              ratios=[1.0], strides=[4, 8, 16, 32, 64]),
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0.0] * 4, target_stds=[1.0] * 4),
        loss_cls=dict(type='FocalLoss', use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
    test_cfg=dict(nms_pre=10, min_bbox_size=0, score_thr=0.05,
                  nms=dict(type='nms', iou_threshold=0.5), max_per_img=10))
# 88 x 140 -> 66 x 105 (x 0.75), padded to 96 x 128 by the preprocessor
test_pipeline = [dict(type='LoadImageFromFile'),
                 dict(type='Resize', scale=(105, 66), keep_ratio=True),
                 dict(type='PackDetInputs',
                      meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))]
test_dataloader = dict(dataset=dict(type='CocoDataset', pipeline=test_pipeline))
visualizer = dict(type='DetLocalVisualizer', vis_backends=[dict(type='LocalVisBackend')],
                  name='visualizer')
"""
# a bright box in the lower right of an 88 x 140 image, where stretching the padded map over the
# image would move it most: rows 56-79, columns 100-129
ORI, BOX = (88, 140), (56, 80, 100, 130)


@pytest.fixture(scope='module')
def scene(tmp_path_factory):
    """The image, the pool model's config (and one padding to a 128 x 160 grid) and a
    checkpoint."""
    root = tmp_path_factory.mktemp('featmaps')
    img = np.zeros((*ORI, 3), np.uint8)
    y0, y1, x0, x1 = BOX
    img[y0:y1, x0:x1] = 255
    cv2.imwrite(str(root / 'box.png'), img)
    for name, grid in (('pool', None), ('pool_grid', (128, 160))):
        (root / f'{name}.py').write_text(POOL_CONFIG.format(grid=grid))
    torch.save({'state_dict': {'backbone.unused': torch.zeros(1)}}, str(root / 'pool.pth'))
    (root / 'featmap_test_pool.py').write_text(POOL_MODULE)
    (root / 'pool_process.py').write_text(
        POOL_CONFIG.format(grid=None) +
        "custom_imports = dict(imports=['featmap_test_pool'], allow_failed_imports=False)\n")
    return root


def _centroid(m: np.ndarray):
    ys, xs = np.mgrid[:m.shape[0], :m.shape[1]]
    return float((m * ys).sum() / m.sum()), float((m * xs).sum() / m.sum())


@pytest.mark.parametrize('config', ['pool', 'pool_grid'])
def test_each_level_lands_on_the_object(scene, config):
    """Every level of the pool model's backbone, aligned, is brightest on the box: its centre
    of mass within 2 px (strides 4, 8), 4 px (16), 12 px (32) of the box's (measured: 0.1, 0.3,
    2.0, 8.7 px, the coarse levels' blur cut at the image's edge); stretching the padded map over
    the image instead (no crop) puts it 21-25 px off (33-43 px with the 128 x 160 grid), a crop
    with height and width swapped cuts the box off. With a backbone padding to a 128 x 160 grid
    (its stride declared) the same."""
    ext = FeatmapExtractor(str(scene / f'{config}.py'), str(scene / 'pool.pth'),
                           ['backbone'], device='cpu')
    (layer,) = ext(cv2.imread(str(scene / 'box.png')), 'squeeze_mean')
    y0, y1, x0, x1 = BOX
    want = ((y0 + y1 - 1) / 2, (x0 + x1 - 1) / 2)
    grids = [(24, 32), (12, 16), (6, 8), (3, 4)] if config == 'pool' else \
        [(32, 40), (16, 20), (8, 10), (4, 5)]
    for level, s, tol, grid in zip(layer.levels, (4, 8, 16, 32), (2, 2, 4, 12), grids):
        assert level.stride == (s, s) and level.label == f'stride {s}'
        assert level.grid == grid
        assert level.valid == (math.ceil(66 / s), math.ceil(105 / s))
        assert level.maps.shape == (1, *ORI) and level.channels is None
        m = level.maps[0].numpy()
        cy, cx = _centroid(m)
        assert abs(cy - want[0]) <= tol and abs(cx - want[1]) <= tol, (s, (cy, cx), want)
        # the box is the brightest part: its mean is above every stretch of the image's
        # background away from it by a stride
        assert m[y0:y1, x0:x1].mean() > 4 * m[:max(y0 - s, 1), :max(x0 - s, 1)].mean()


def test_select_max_and_topk_pick_channels_by_the_valid_cells(scene):
    """``select_max`` and ``none`` take channels by their sums over the valid cells: a channel
    large only in the padding is not picked."""
    ext = FeatmapExtractor(str(scene / 'pool.py'), None, ['backbone'], device='cpu')

    def forward(x):
        levels = []
        for s in (4, 8, 16, 32):
            b = F.avg_pool2d(x.mean(1, keepdim=True), s)
            decoy = torch.zeros_like(b)
            decoy[..., math.ceil(66 / s):, :] = 1e4  # large, in the cells of padding only
            levels.append(torch.cat([b, decoy, b * 0.5], 1))
        return tuple(levels)
    ext.model.backbone.forward = forward
    # three channels: the FPN (built for one) is left out
    ext.model.extract_feat = lambda x: ext.model.backbone(x)
    img = cv2.imread(str(scene / 'box.png'))
    (layer,) = ext(img, 'select_max')
    assert all(lvl.channels == (0,) and lvl.maps.shape == (1, *ORI) for lvl in layer.levels)
    (layer,) = ext(img, 'none', topk=2)
    assert all(lvl.channels == (0, 2) and lvl.maps.shape == (2, *ORI) for lvl in layer.levels)
    (layer,) = ext(img, 'squeeze_mean')
    assert layer.levels[0].channels is None


# ------------------------------------------------------------------------------ every family
FAMILIES = {
    'XCiT': (dict(type='XCiT', arch='nano_12_p16'), 128),
    'CaiT': (dict(type='CaiT', arch='xxs24'), 192),
    'TimmViT': (dict(type='TimmViT', arch='vit_tiny_patch16_224'), 192),
    'TimmEVA': (dict(type='TimmEVA', arch='test_eva'), 64),
    'TimmBEiT': (dict(type='TimmBEiT', arch='test_beit', **SMALL_GRID['TimmBEiT']), 64),
}


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_every_family_in_a_detector(tmp_path, family):
    """Each family as the demo detector's backbone (its first 4 blocks), on a 40 x 56 image
    (resized to 64 x 90, padded to 64 x 96; BEiT pads further, to its 96 x 96 grid): every
    backbone level and the neck's five at the original size, strides 4-32 (64), cropped to
    ceil(64 / stride) x ceil(90 / stride) cells."""
    backbone, dim = FAMILIES[family]
    img = np.random.RandomState(0).randint(0, 255, (40, 56, 3)).astype(np.uint8)
    options = {'model.backbone': dict(_delete_=True, out_indices=EARLY, init_cfg=None, **backbone),
               'model.neck.in_channels': [dim] * 4,
               # small: 40 x 56 -> 64 x 90, padded to 64 x 96 (BEiT: its 96 x 96 grid)
               'test_dataloader.dataset.pipeline.1.scale': (90, 64)}
    ext = FeatmapExtractor(DEMO_DET, None, ['backbone', 'neck'], device='cpu',
                           cfg_options=options)
    bb, neck = ext(img, 'select_max')
    assert [lvl.stride for lvl in bb.levels] == [(s, s) for s in (4, 8, 16, 32)]
    assert [lvl.stride for lvl in neck.levels] == [(s, s) for s in (4, 8, 16, 32, 64)]
    for lvl in bb.levels + neck.levels:
        s = lvl.stride[0]
        assert lvl.valid == (math.ceil(64 / s), math.ceil(90 / s)), (lvl.grid, lvl.valid, s)
        assert lvl.maps.shape == (1, 40, 56) and torch.isfinite(lvl.maps).all()
    if family == 'TimmBEiT':  # the grid is BEiT's, beyond the preprocessor's padding
        assert bb.levels[0].grid == (24, 24)
    else:
        assert bb.levels[0].grid == (16, 24)


def test_a_segmentor_unpadded(tmp_path):
    """mmseg's demo config (XCiT, pad_input=False: its conv stem rounds up, no padding): the
    backbone's and the FPN's levels at the image's size, strides 4-32."""
    img = np.random.RandomState(0).randint(0, 255, (50, 70, 3)).astype(np.uint8)
    ext = FeatmapExtractor(DEMO_SEG, None, ['backbone', 'neck'], device='cpu',
                           cfg_options={'test_dataloader.dataset.pipeline.1.scale': (1024, 100)})
    bb, neck = ext(img, 'squeeze_mean')
    for layer in (bb, neck):
        assert [lvl.label for lvl in layer.levels] == [f'stride {s}' for s in (4, 8, 16, 32)]
        for lvl in layer.levels:
            assert lvl.maps.shape == (1, 50, 70) and torch.isfinite(lvl.maps).all()
    # 100 x 140 through patch 16 rounded up: 7 x 9 patches, stride 4 -> 28 x 36 cells, of which
    # ceil(100 / 4) x ceil(140 / 4) see the image
    assert bb.levels[0].grid == (28, 36) and bb.levels[0].valid == (25, 35)


# ------------------------------------------------------------------------------ the tool
@pytest.fixture
def tool(in_process):
    """``tools/analysis/featmap_vis.py`` run in this process (one test starts it as a process)."""
    return functools.partial(in_process, TOOL)


def test_tool_writes_pictures_and_arrays(scene, tool, tmp_path):
    """A folder of two images, backbone and neck, ``--save-arrays``: a PNG and an .npz a layer
    and image; the .npz holds one array a level at the image's size, equal to the extractor's
    maps; ``none`` with top-2 channels keeps their indices."""
    folder = tmp_path / 'imgs'
    folder.mkdir()
    img = cv2.imread(str(scene / 'box.png'))
    cv2.imwrite(str(folder / 'a.png'), img)
    cv2.imwrite(str(folder / 'b.jpg'), img[:, ::-1])
    (folder / 'notes.txt').write_text('not an image: skipped by its suffix')
    out = tmp_path / 'out'
    run = tool(folder, scene / 'pool.py', scene / 'pool.pth', '--target-layers', 'backbone',
               'neck', '--channel-reduction', 'squeeze_mean', '--save-arrays', '--device', 'cpu',
               '--out-dir', out, cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert sorted(os.listdir(out)) == sorted(f'{i}_{layer}_0.{ext}' for i in 'ab'
                                             for layer in ('backbone', 'neck')
                                             for ext in ('png', 'npz'))
    assert f'8 files written in {out}' in run.stdout
    arrays = np.load(out / 'a_backbone_0.npz')
    assert sorted(arrays) == ['stride_16', 'stride_32', 'stride_4', 'stride_8']
    (layer,) = FeatmapExtractor(str(scene / 'pool.py'), None, ['backbone'], device='cpu')(
        img, 'squeeze_mean')
    for lvl in layer.levels:
        a = arrays[lvl.label.replace(' ', '_')]
        assert a.shape == ORI and a.dtype == np.float32
        np.testing.assert_allclose(a, lvl.maps[0].numpy(), rtol=1e-6)
    assert sorted(np.load(out / 'a_neck_0.npz')) == [f'stride_{s}' for s in (16, 32, 4, 64, 8)]
    png = cv2.imread(str(out / 'a_backbone_0.png'))
    assert png.shape == (2 * ORI[0], 2 * ORI[1], 3)  # four levels in rows of two
    run = tool(folder / 'a.png', scene / 'pool.py', scene / 'pool.pth', '--channel-reduction',
               'none', '--topk', '1', '--arrangement', '1', '1', '--save-arrays',
               '--out-dir', tmp_path / 'none', cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    arrays = np.load(tmp_path / 'none' / 'a_backbone_0.npz')
    assert arrays['stride_4'].shape == ORI and list(arrays['stride_4_channels']) == [0]


def test_tool_answers_bad_input_in_one_line_and_writes_nothing(scene, tool, tmp_path):
    bad = tmp_path / 'broken.jpg'
    bad.write_bytes(b'not a jpeg')
    good = tmp_path / 'imgs'
    good.mkdir()
    cv2.imwrite(str(good / 'a.png'), cv2.imread(str(scene / 'box.png')))
    cfg, ckpt = scene / 'pool.py', scene / 'pool.pth'
    cases = [
        ((bad, cfg, ckpt), f"cannot read image '{bad}': not an image file OpenCV decodes"),
        ((tmp_path / 'missing.png', cfg, ckpt), 'image not found:'),
        ((tmp_path / 'empty', cfg, ckpt), 'image not found:'),
        ((good, cfg, ckpt, '--target-layers', 'nek'),
         "layer 'nek': the model has no such module; choose backbone or neck or a module inside "
         'them (--preview-model lists them)'),
        ((good, cfg, ckpt, '--target-layers', 'bbox_head'),
         "layer 'bbox_head': it is not run by the model's extract_feat"),
        ((good, cfg, ckpt, '--channel-reduction', 'none', '--topk', '5'),
         '--topk 5 channels do not fit --arrangement 2 2'),
        ((good, tmp_path / 'nope.py', ckpt), 'config not found:'),
        ((good, cfg, tmp_path / 'nope.pth'), 'nope.pth'),
    ]
    for args, message in cases:
        run = tool(*args, '--device', 'cpu', '--out-dir', tmp_path / 'out', cwd=tmp_path)
        assert run.returncode == 1, (args, run.stdout + run.stderr)
        lines = run.stderr.strip().splitlines()
        assert lines and message in lines[-1] and 'Traceback' not in run.stderr, (args, lines)
        assert not (tmp_path / 'out').exists(), args


def test_tool_refuses_a_layer_that_gives_no_maps(scene, tool, tmp_path):
    """A module whose output is not (N, C, H, W) maps is refused before anything is written."""
    cfg = scene / 'pool_tokens.py'
    cfg.write_text(POOL_CONFIG.format(grid=None) + "model['neck'] = dict(type='ChannelMapper', "
                   "in_channels=[1, 1, 1, 1], out_channels=4)\n")
    run = tool(scene / 'box.png', cfg, scene / 'pool.pth', '--target-layers',
               'neck.convs.0.conv.weight', '--device', 'cpu', '--out-dir', tmp_path / 'out',
               cwd=tmp_path)
    assert run.returncode == 1 and 'no such module' in run.stderr
    run = tool(scene / 'box.png', scene / 'pool.py', scene / 'pool.pth', '--target-layers',
               'neck.fpn_convs.0', '--device', 'cpu', '--out-dir', tmp_path / 'out',
               cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]  # a module inside the neck: its maps
    assert os.listdir(tmp_path / 'out') == ['box_neck.fpn_convs.0_0.png']


@pytest.mark.slow
def test_tool_runs_as_a_process_headless(scene, tmp_path):
    """tools/analysis/featmap_vis.py as a process with no display (DISPLAY unset, matplotlib's
    backend not chosen): the picture written. ~5-10 s: a new Python process importing mmdet."""
    env = {k: v for k, v in os.environ.items() if k not in ('DISPLAY', 'MPLBACKEND')}
    env['PYTHONPATH'] = str(scene)  # the pool model's module
    out = subprocess.run([sys.executable, TOOL, str(scene / 'box.png'),
                          str(scene / 'pool_process.py'),
                          str(scene / 'pool.pth'), '--channel-reduction', 'none', '--topk', '2',
                          '--out-dir', str(tmp_path / 'out')],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    png = cv2.imread(str(tmp_path / 'out' / 'box_backbone_0.png'))
    # the levels (one channel each: the pool model's) in rows of two
    assert png.shape == (2 * ORI[0], 2 * ORI[1], 3)


def test_visualize_featmaps_refuses_before_building_the_model(tmp_path):
    with pytest.raises(VisualizationError, match='choose from squeeze_mean, select_max, none'):
        visualize_featmaps(str(tmp_path), DEMO_DET, 'x.pth', str(tmp_path / 'o'),
                           channel_reduction='max')
    with pytest.raises(VisualizationError, match=r'--alpha 2: give a weight in \[0, 1\]'):
        visualize_featmaps(str(tmp_path), DEMO_DET, 'x.pth', str(tmp_path / 'o'), alpha=2)
    assert not (tmp_path / 'o').exists()


def test_tool_on_a_segmentor_and_its_preview(tmp_path, tool):
    """mmseg's demo config through the tool (its SegLocalVisualizer, its test pipeline without
    annotations): the backbone's and the FPN's pictures and arrays at the image's size;
    ``--preview-model`` prints the modules and writes nothing."""
    from deepvit_mm.apis import build_from_config
    model, _ = build_from_config(DEMO_SEG)
    torch.save({'state_dict': model.state_dict()}, str(tmp_path / 'seg.pth'))
    img = np.random.RandomState(1).randint(0, 255, (48, 80, 3)).astype(np.uint8)
    cv2.imwrite(str(tmp_path / 'scene.jpg'), img)
    args = (tmp_path / 'scene.jpg', DEMO_SEG, tmp_path / 'seg.pth', '--target-layers', 'backbone',
            'neck', '--device', 'cpu', '--out-dir', tmp_path / 'out', '--cfg-options',
            'test_dataloader.dataset.pipeline.1.scale=(1024,96)')
    run = tool(*args, '--preview-model', cwd=tmp_path)
    assert run.returncode == 0 and '(backbone): XCiT(' in run.stdout and '(neck): FPN(' in run.stdout
    assert not (tmp_path / 'out').exists()
    run = tool(*args, '--save-arrays', cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    for layer in ('backbone', 'neck'):
        assert (tmp_path / 'out' / f'scene_{layer}_0.png').is_file()
        arrays = np.load(tmp_path / 'out' / f'scene_{layer}_0.npz')
        assert {a.shape for k, a in arrays.items() if not k.endswith('_channels')} == {(48, 80)}
