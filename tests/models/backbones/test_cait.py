"""CaiT only: its position embedding at any input size (resampling and its cache), windowed
attention, query-chunked attention, its checkpoints and recipes, its arguments. Shapes, gradients,
parity with timm at the model's own grid, the paper's sizes (Tables 3 and 4), arch names and input
checks of every arch: test_backbones.py."""
import copy
import gc
import os

import pytest
import timm
import torch
import torch.nn.functional as F
from conftest import CONFIG_DIR, EARLY, build_model, finite_loss_and_grads, randomize_, seg_inputs
from mmengine.config import Config
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from timm.models.cait import TalkingHeadAttn

from deepvit_mm import CaiT, CheckpointError, XCiT
from deepvit_mm.models.backbones.cait.window_attention import GridTalkingHeadAttn, talking_heads_chunked
from deepvit_mm.utils import meta_device


def _timm_model(name: str, **kwargs) -> torch.nn.Module:
    return randomize_(timm.create_model(name, num_classes=1000, **kwargs)).eval()


# ------------------------------------------------------------------------------ parity with timm
@pytest.mark.parametrize('hw', [(160, 224), (96, 320)])
def test_taps_at_other_sizes_equal_timm_with_resampled_embedding(hw):
    """At a size timm's Cait cannot take, the taps are those of a timm Cait built for that size
    whose position embedding was resampled by timm's own helper."""
    m = CaiT('xxs24', out_indices=(1, 3, 4, 6)).eval()
    randomize_(m)
    grid = (hw[0] // 16, hw[1] // 16)
    ref = timm.create_model('cait_xxs24_224', num_classes=0, img_size=hw, depth=7)
    sd = {k[6:]: v for k, v in m.state_dict().items() if k.startswith('trunk.')}
    sd['pos_embed'] = resample_abs_pos_embed(sd['pos_embed'], grid, (14, 14), num_prefix_tokens=0)
    ref.load_state_dict(sd, strict=False)
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        want = ref.eval().forward_intermediates(x, indices=list(m.out_indices),
                                                intermediates_only=True, stop_early=True)
        got = m._forward_taps(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape == (1, 192, *grid)
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ architectures
@pytest.mark.slow
def test_timm_name_sets_the_position_embedding_grid():
    """A timm name's resolution (or ``img_size``) sets the position-embedding grid. Builds CaiT-S36,
    CaiT-M48 and CaiT-S24 (twice) at full depth on the meta device."""
    # (name resolution itself: test_backbones.py)
    assert CaiT.arch_zoo.resolve('cait_xxs24_384.fb_dist_in1k', 'CaiT') == 'xxs24'
    with meta_device():
        assert CaiT('cait_s36_384.fb_dist_in1k').pos_embed_grid == (24, 24)
        assert CaiT('cait_m48_448').pos_embed_grid == (28, 28)
        assert CaiT('s24').pos_embed_grid == (14, 14)
        assert CaiT('s24', img_size=384).pos_embed_grid == (24, 24)


def test_bad_arguments_refused():
    # (unknown archs and bad out_indices of every family: test_backbones.py)
    with pytest.raises(ValueError, match='embed_dim is fixed'):
        CaiT('xxs24', embed_dim=256)
    with pytest.raises(ValueError, match='must be square'):
        CaiT('xxs24', img_size=(224, 320))
    with pytest.raises(ValueError, match='window_size'):
        CaiT('xxs24', window_size=-2)
    with pytest.raises(ValueError, match='needs window_size > 0'):
        CaiT('xxs24', global_blocks=(3, 7))
    with pytest.raises(ValueError, match='global_blocks'):
        CaiT('xxs24', window_size=7, global_blocks=(3, 24))


# ------------------------------------------------------------------------------ any input size
@pytest.fixture(scope='module')
def windowed_xxs24():
    return CaiT('xxs24', window_size=3).eval()


# global attention at these sizes: test_backbones.py
@pytest.mark.parametrize('hw', [(64, 64), (96, 160), (70, 45), (33, 100)])
def test_windowed_output_shapes_and_strides(hw, windowed_xxs24):
    m = windowed_xxs24
    with torch.no_grad():
        outs = m(torch.randn(1, 3, *hw))
    H, W = (-(-hw[0] // 32) * 32, -(-hw[1] // 32) * 32)  # padded to a multiple of 32
    assert [tuple(o.shape) for o in outs] == [(1, 192, H // s, W // s) for s in (4, 8, 16, 32)]
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('grid', [(5, 7), (20, 14), (14, 14), (9, 31), (3, 2)])
def test_resampled_embedding_equals_timms_dynamic_size_vit(grid):
    """timm's ViT with ``dynamic_img_size`` resamples its (class-free) embedding the same way."""
    m = CaiT('xxs24', out_indices=EARLY).eval()
    vit = timm.create_model('vit_tiny_patch16_224', num_classes=0, class_token=False,
                            no_embed_class=True, global_pool='avg', embed_dim=192, depth=1,
                            dynamic_img_size=True).eval()
    with torch.no_grad():
        vit.pos_embed.copy_(m.trunk.pos_embed)
        want = vit._pos_embed(torch.zeros(1, *grid, 192))  # adds its resampled embedding to 0
        got = m.pos_embed_for(grid)
        assert got.shape == (1, grid[0] * grid[1], 192)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        direct = resample_abs_pos_embed(m.trunk.pos_embed, list(grid), num_prefix_tokens=0)
        torch.testing.assert_close(got, direct, atol=0, rtol=0)


def test_pos_embed_cache_in_inference_and_invalidation():
    m = CaiT('xxs24', out_indices=EARLY).eval()
    with torch.no_grad():
        a = m.pos_embed_for((10, 20))
        assert m.pos_embed_for((10, 20)) is a  # cached per grid
        assert m.pos_embed_for((14, 14)) is m.trunk.pos_embed  # own grid: nothing to resample
        m.trunk.pos_embed.mul_(2)  # any in-place change (optimizer step, load_state_dict)
        b = m.pos_embed_for((10, 20))
    assert b is not a
    torch.testing.assert_close(b, 2 * a)
    sd = copy.deepcopy(m.state_dict())
    sd['trunk.pos_embed'] = torch.zeros_like(sd['trunk.pos_embed'])
    m.load_state_dict(sd)
    with torch.no_grad():
        assert m.pos_embed_for((10, 20)).abs().sum() == 0
        for i in range(12):
            m.pos_embed_for((4 + i, 5))
    assert len(m._pos_cache) == 8  # bounded


def test_pos_embed_trains_through_resampling_and_frozen_one_is_cached():
    m = CaiT('xxs24', out_indices=EARLY, drop_path_rate=0.0).train()
    a = m.pos_embed_for((10, 20))
    assert a.requires_grad and m.pos_embed_for((10, 20)) is not a  # recomputed: gradients flow
    a.sum().backward()
    assert m.trunk.pos_embed.grad is not None and m.trunk.pos_embed.grad.abs().sum() > 0
    frozen = CaiT('xxs24', out_indices=EARLY, frozen_stages=0).train()
    assert not frozen.trunk.pos_embed.requires_grad
    assert frozen.pos_embed_for((10, 20)) is frozen.pos_embed_for((10, 20))


# ------------------------------------------------------------------------------ windows
@pytest.mark.parametrize('hw', [(4, 6), (5, 7)])
def test_window_attention_is_timms_attention_per_window(hw):
    torch.manual_seed(0)
    attn = GridTalkingHeadAttn(32, num_heads=4, qkv_bias=True, window_size=2).eval()
    ref = TalkingHeadAttn(32, num_heads=4, qkv_bias=True).eval()
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(2, *hw, 32)
    with torch.no_grad():
        got = attn(x)
        H, W = hw
        xp = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))  # zero padding to a multiple of the window
        want = torch.empty_like(xp)
        for i in range(0, xp.shape[1], 2):
            for j in range(0, xp.shape[2], 2):
                win = xp[:, i:i + 2, j:j + 2].reshape(2, 4, 32)
                want[:, i:i + 2, j:j + 2] = ref(win).reshape(2, 2, 2, 32)
        torch.testing.assert_close(got, want[:, :H, :W], atol=1e-6, rtol=1e-5)
        attn.window_size = 0
        torch.testing.assert_close(attn(x), ref(x.reshape(2, H * W, 32)).reshape(x.shape),
                                   atol=1e-6, rtol=1e-5)
        attn.window_size = 8  # a grid within one window: global attention, no padding
        torch.testing.assert_close(attn(x), ref(x.reshape(2, H * W, 32)).reshape(x.shape),
                                   atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_windowed_blocks_and_global_blocks():
    """``window_size`` windows every block but the global ones (by default the taps'). Builds
    CaiT-XXS24 at full depth three times on the meta device."""
    with meta_device():  # structure only
        m = CaiT('xxs24', window_size=14)
    assert all(isinstance(b.attn, GridTalkingHeadAttn) for b in m.trunk.blocks)
    assert m.global_blocks == m.out_indices == (7, 11, 15, 23)
    sizes = [b.attn.window_size for b in m.trunk.blocks]
    assert [i for i, s in enumerate(sizes) if s == 0] == [7, 11, 15, 23]
    assert all(s == 14 for i, s in enumerate(sizes) if i not in (7, 11, 15, 23))
    with meta_device():
        m = CaiT('xxs24', window_size=7, global_blocks=(5, 17))
        assert [i for i, b in enumerate(m.trunk.blocks) if b.attn.window_size == 0] == [5, 17]
        assert all(b.attn.window_size == 0 for b in CaiT('xxs24').trunk.blocks)


def test_windowed_taps_see_only_their_window():
    """Before the first global block, a change in one window stays inside that window."""
    m = CaiT('xxs24', out_indices=(0, 1, 2, 3), window_size=2, global_blocks=(3,),
             drop_path_rate=0.0).eval()
    randomize_(m)
    x = torch.randn(1, 3, 128, 128)  # 8x8 patches, 4x4 windows of 2x2
    y = x.clone()
    y[..., 16:32, 16:32] += 1.0  # patch (1, 1): window (0, 0)
    with torch.no_grad():
        a, b = m._forward_taps(x), m._forward_taps(y)
    for k in range(3):  # windowed blocks
        changed = (a[k] - b[k]).abs().amax(dim=1)[0] > 1e-6
        assert changed[:2, :2].any() and not changed[2:].any() and not changed[:, 2:].any()
    assert ((a[3] - b[3]).abs().amax(dim=1)[0] > 1e-6)[4:, 4:].any()  # global block 3


# (global attention without checkpointing: test_backbones.py)
@pytest.mark.parametrize('window_size,with_cp', [(4, False), (4, True), (0, True)])
@pytest.mark.slow
def test_every_trainable_parameter_gets_a_gradient(window_size, with_cp):
    # 8 blocks, 2 of them global when windowed
    """Every trainable CaiT parameter gets a finite gradient. ~2-8 s: CaiT's forward and backward at
    full depth."""
    m = CaiT('xxs24', out_indices=(1, 3, 5, 7), window_size=window_size,
             global_blocks=(3, 7) if window_size else None, with_cp=with_cp,
             drop_path_rate=0.0).train()
    assert m.trunk.grad_checkpointing == with_cp and len(m.trunk.blocks) == 8
    randomize_(m)
    outs = m(torch.randn(2, 3, 96, 160))  # 6x10 patches, not a multiple of the window
    loss = sum(o.float().pow(2).mean() for o in outs)
    assert torch.isfinite(loss)
    loss.backward()
    no_grad = [n for n, p in m.named_parameters() if p.requires_grad and
               (p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0)]
    assert not no_grad, no_grad


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_output_and_gradients():
    """with_cp gives the outputs and gradients of the plain windowed model. Two CaiT-XXS24 (4
    blocks) built, a forward and backward of each at 96x128, the checkpointed one recomputing its
    blocks."""
    torch.manual_seed(0)
    a = CaiT('xxs24', out_indices=EARLY, window_size=4, drop_path_rate=0.0).train()
    randomize_(a)
    b = CaiT('xxs24', out_indices=EARLY, window_size=4, drop_path_rate=0.0, with_cp=True).train()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 96, 128)
    grads = []
    for m in (a, b):
        out = m(x)
        sum(o.pow(2).mean() for o in out).backward()
        grads.append((out, m.trunk.blocks[0].attn.qkv.weight.grad, m.trunk.pos_embed.grad))
    for u, v in zip(grads[0][0], grads[1][0]):
        torch.testing.assert_close(u, v)
    torch.testing.assert_close(grads[0][1], grads[1][1])
    torch.testing.assert_close(grads[0][2], grads[1][2])


def test_windowed_cait_trains_in_mmdets_mask_rcnn():
    from mmdet.testing import demo_mm_inputs
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, 'demo', 'mask_rcnn_cait_xxs24_shapes.py'))
    cfg.model.backbone.update(window_size=3, with_cp=True, out_indices=EARLY)
    model = build_model(cfg)
    log_vars = finite_loss_and_grads(model, demo_mm_inputs(
        batch_size=2, image_shapes=[(3, 96, 128), (3, 128, 80)], num_items=[3, 2], num_classes=3,
        with_mask=True))
    assert {'loss_cls', 'loss_mask', 'loss_rpn_cls'} <= set(log_vars)


@pytest.mark.slow
def test_cait_recipe_trains_in_mmsegs_upernet():
    """The CaiT UperNet recipe trains a step with decode and auxiliary losses. Builds its UperNet
    (CaiT-XXS24's first 4 blocks, 32-channel heads), a forward and backward at 64x96, batch 2."""
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, 'upernet_cait_xxs24_160k_ade20k.py'))
    cfg.model.backbone.update(out_indices=EARLY)
    cfg.model.decode_head.channels = 32
    cfg.model.auxiliary_head.channels = 32
    cfg.model.data_preprocessor.update(size=None, size_divisor=32)  # 64x96, not 512x512 crops
    model = build_model(cfg)
    log_vars = finite_loss_and_grads(model, seg_inputs(batch=2, h=64, w=96))
    assert {'decode.loss_ce', 'aux.loss_ce'} <= set(log_vars)


# ------------------------------------------------------------------------------ weights
@pytest.fixture(scope='module')
def timm_xxs24_384():
    torch.manual_seed(1)
    return _timm_model('cait_xxs24_384', depth=len(EARLY))


def _build(path, arch='xxs24', **kwargs):
    from mmdet.registry import MODELS
    kwargs.setdefault('out_indices', EARLY)
    m = MODELS.build(dict(type='CaiT', arch=arch, **kwargs,
                          init_cfg=dict(type='Pretrained', checkpoint=str(path))))
    m.init_weights()
    return m.eval()


def _assert_taps_match(backbone, timm_model, res):
    x = torch.randn(1, 3, res, res)
    with torch.no_grad():
        want = timm_model.forward_intermediates(x, indices=list(backbone.out_indices),
                                                intermediates_only=True, stop_early=True)
        got = backbone._forward_taps(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def _official_file(tmp_path, timm_model) -> str:
    """A timm model's weights in the official release layout (``{'model': ...}``, DDP prefix)."""
    path = tmp_path / 'XXS24_384.pth'
    sd = {f'module.{k}': v.clone() for k, v in timm_model.state_dict().items()}
    torch.save({'model': sd, 'epoch': 400, 'args': {'lr': 1e-3}}, path)
    return str(path)


def test_official_release_at_its_own_grid(tmp_path, timm_xxs24_384):
    """An official 384 release into a model built at 384: loaded as is, taps equal timm's."""
    path = _official_file(tmp_path, timm_xxs24_384)
    m = CaiT('cait_xxs24_384', out_indices=EARLY, init_cfg=dict(type='Pretrained', checkpoint=path))
    report = m.load_pretrained(path)
    assert report.resized == []
    _assert_taps_match(m.eval(), timm_xxs24_384, 384)
    dropped = set(report.dropped)
    assert {'trunk.head.weight', 'trunk.cls_token', 'trunk.norm.weight'} <= dropped
    assert any(k.startswith('trunk.blocks_token_only.') for k in dropped)
    assert report.left_at_init and all(k.startswith('adapter.') for k in report.left_at_init)
    text = report.format()
    assert 'dropped on purpose' in text and 'left at init' in text


def test_official_release_resampled_into_another_grid(tmp_path, timm_xxs24_384):
    """Into a model built at 224 the 24x24 embedding is resampled once, by timm's helper, and the
    report says so; the parameter keeps its shape (DDP may already hold it)."""
    path = _official_file(tmp_path, timm_xxs24_384)
    m = CaiT('xxs24', out_indices=EARLY)
    param = m.trunk.pos_embed
    report = m.load_pretrained(path)
    assert m.trunk.pos_embed is param and m.pos_embed_grid == (14, 14)
    assert report.resized == [('trunk.pos_embed', (1, 576, 192), (1, 196, 192))]
    assert 'resized: trunk.pos_embed (1, 576, 192) -> (1, 196, 192)' in report.format()
    want = resample_abs_pos_embed(timm_xxs24_384.pos_embed, [14, 14], num_prefix_tokens=0)
    torch.testing.assert_close(m.trunk.pos_embed.data, want, atol=0, rtol=0)


def test_resampling_checkpoint_under_ddp_trains(tmp_path, timm_xxs24_384):
    """mmengine wraps the model in DDP before init_weights: loading a checkpoint of another grid
    must not change a parameter's shape under DDP's gradient hooks."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    path = _official_file(tmp_path, timm_xxs24_384)
    m = CaiT('xxs24', out_indices=EARLY, drop_path_rate=0.0,
             init_cfg=dict(type='Pretrained', checkpoint=path))
    store = dist.HashStore()
    dist.init_process_group('gloo', store=store, rank=0, world_size=1)
    ddp = None
    try:
        ddp = DistributedDataParallel(m)
        m.init_weights()
        sum(o.pow(2).mean() for o in ddp(torch.randn(1, 3, 64, 96))).backward()
        assert m.trunk.pos_embed.grad.shape == (1, 196, 192)
    finally:
        # DDP's Reducer holds the gloo group: release it before the group is destroyed. Left to
        # be collected afterwards, the group's destructor ran from the Reducer's and hung joining
        # its threads (seen once: pytest stuck in ~ProcessGroupGloo).
        del ddp
        gc.collect()
        dist.destroy_process_group()


@pytest.mark.slow
def test_timm_pth_and_safetensors(tmp_path):
    """timm's CaiT weights as .pth and .safetensors load with one report. ~1-4 s."""
    torch.manual_seed(2)
    ref = _timm_model('cait_xxs24_224', depth=len(EARLY))
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    torch.save(sd, tmp_path / 'timm.pth')
    save_file(sd, str(tmp_path / 'timm.safetensors'))
    for name in ('timm.pth', 'timm.safetensors'):
        m = _build(tmp_path / name, arch='cait_xxs24_224.fb_dist_in1k')
        assert m.pos_embed_grid == (14, 14)
        _assert_taps_match(m, ref, 224)


@pytest.mark.slow
def test_detector_checkpoint_through_mmengine(tmp_path, timm_xxs24_384):
    """load_from / resume / tools/test.py read our detector checkpoints with mmengine's loader:
    at the same grid everything loads as saved; into another grid the embedding is resampled
    (mmengine would otherwise skip the tensor with a size-mismatch warning)."""
    from mmengine.runner.checkpoint import load_checkpoint
    src = CaiT('cait_xxs24_384', out_indices=EARLY)
    kept = ('pos_embed', 'patch_embed', *(f'blocks.{i}.' for i in EARLY))
    src.load_state_dict({f'trunk.{k}': v for k, v in timm_xxs24_384.state_dict().items()
                         if k.startswith(kept)}, strict=False)
    path = tmp_path / 'detector.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in src.state_dict().items()},
                'meta': {}}, path)
    for arch, grid in (('cait_xxs24_384', 24), ('xxs24', 14)):
        detector = torch.nn.Module()
        detector.backbone = CaiT(arch, out_indices=EARLY)
        load_checkpoint(detector, str(path), map_location='cpu', strict=True)
        got = detector.backbone.state_dict()
        assert detector.backbone.pos_embed_grid == (grid, grid)
        for k, v in src.state_dict().items():
            if k != 'trunk.pos_embed':
                torch.testing.assert_close(got[k], v)
        want = resample_abs_pos_embed(src.trunk.pos_embed, [grid, grid], num_prefix_tokens=0)
        torch.testing.assert_close(got['trunk.pos_embed'], want, atol=0, rtol=0)
    # and our own loader (init_cfg) reads the same file
    _assert_taps_match(_build(path, arch='cait_xxs24_384'), timm_xxs24_384, 384)


@pytest.mark.slow
def test_other_cait_size_refused(tmp_path):
    """A CaiT-XXS36 checkpoint into XXS24 is refused naming the blocks XXS24 lacks. timm's
    CaiT-XXS36 built at full depth and saved."""
    path = tmp_path / 'xxs36.pth'
    torch.save({'model': timm.create_model('cait_xxs36_224').state_dict()}, path)
    with pytest.raises(CheckpointError, match=r"CaiT\(arch='xxs36'\).*does not have.*trunk\.blocks\.\*"):
        _build(path)


@pytest.mark.slow
def test_cait_checkpoint_into_xcit_refused(tmp_path):
    """A CaiT checkpoint into XCiT is refused, naming CaiT-XXS24 as what it looks like. timm's
    CaiT-XXS24 built at full depth and saved, XCiT-N12/16 built."""
    path = tmp_path / 'cait.pth'
    torch.save(timm.create_model('cait_xxs24_224').state_dict(), path)
    with pytest.raises(CheckpointError) as e:
        XCiT('nano_12_p16').load_pretrained(str(path))
    assert "It looks like a checkpoint of CaiT(arch='xxs24')" in str(e.value)


def test_xcit_checkpoint_into_cait_refused(tmp_path):
    path = tmp_path / 'xcit.pth'
    torch.save({'model': timm.create_model('xcit_nano_12_p16_224').state_dict()}, path)
    with pytest.raises(CheckpointError) as e:
        _build(path)
    assert "It looks like a checkpoint of XCiT(arch='nano_12_p16')" in str(e.value)


# ------------------------------------------------------------------------------ recipes
@pytest.mark.parametrize('size', ['xxs24', 'xs24', 's24'])
@pytest.mark.slow
def test_cait_recipes(size):
    """A CaiT recipe has the XCiT recipes' hyper-parameters, its checkpoint's resolution and
    channels. Reads three configs through their chains of bases (its Mask R-CNN and UperNet,
    XCiT-S12's)."""
    dim = CaiT.arch_zoo[size].embed_dim
    det = Config.fromfile(os.path.join(CONFIG_DIR, f'mask_rcnn_cait_{size}_3x.py'))
    xcit = Config.fromfile(os.path.join(CONFIG_DIR, 'mask_rcnn_xcit_s12_16_3x.py'))
    # the XCiT recipes' hyper-parameters
    for key in ('optim_wrapper.optimizer', 'param_scheduler', 'train_cfg', 'auto_scale_lr',
                'train_dataloader.batch_size', 'train_dataloader.dataset.pipeline'):
        assert _get(det, key) == _get(xcit, key), key
    bb = det.model.backbone
    assert (bb.type, bb.arch, bb.window_size, bb.with_cp) == ('CaiT', size, 14, True)
    # the checkpoint's resolution: its position embedding loads as trained
    res = 384 if size == 'xs24' else 224
    assert bb.img_size == res and bb.init_cfg.checkpoint.endswith(f'_{res}.pth')
    assert det.model.neck.in_channels == [dim] * 4
    # the official XCiT rule with CaiT's position embedding for Swin's (the groups of every
    # parameter: tests/configs/test_recipes.py)
    assert det.optim_wrapper.paramwise_cfg.custom_keys == dict(
        xcit.optim_wrapper.paramwise_cfg.custom_keys, pos_embed=dict(decay_mult=0.))

    seg = Config.fromfile(os.path.join(CONFIG_DIR, f'upernet_cait_{size}_160k_ade20k.py'))
    opt = seg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay) == ('AdamW', 6e-5, 0.01)
    assert seg.train_dataloader.batch_size * 8 == 16 and seg.crop_size == (512, 512)
    assert seg.train_cfg.max_iters == 160000 and seg.model.pretrained is None
    assert seg.model.backbone.arch == size and seg.model.backbone.img_size == res
    assert seg.model.decode_head.in_channels == [dim] * 4
    assert seg.model.auxiliary_head.in_channels == dim


def _get(cfg, dotted):
    for k in dotted.split('.'):
        cfg = cfg[k]
    return cfg


# ------------------------------------------------------------------------------ query-chunked inference
def _randomized_talking_heads(dim=48, heads=4):
    torch.manual_seed(0)
    attn = GridTalkingHeadAttn(dim, num_heads=heads, qkv_bias=True).eval()
    for p in attn.parameters():  # head-mixing weights and biases far from identity / zero
        p.data.normal_(0, 0.5)
    ref = TalkingHeadAttn(dim, num_heads=heads, qkv_bias=True).eval()
    ref.load_state_dict(attn.state_dict())
    return attn, ref


@pytest.mark.parametrize('chunk', [1, 7, 64, 1000])  # single rows, ragged, exact, one chunk
def test_query_chunked_attention_equals_timm(chunk):
    attn, ref = _randomized_talking_heads()
    x = torch.randn(2, 64, 48)
    with torch.no_grad():
        want = ref(x)
        torch.testing.assert_close(talking_heads_chunked(attn, x, chunk), want,
                                   rtol=1e-4, atol=1e-5 * want.abs().max().item())


@pytest.mark.numerics
def test_query_chunked_attention_under_bf16_autocast():
    attn, ref = _randomized_talking_heads()
    x = torch.randn(1, 50, 48)
    with torch.no_grad():
        exact = ref(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            ours, theirs = talking_heads_chunked(attn, x, 16), ref(x)

    def err(y):
        return ((y.float() - exact).abs().max() / exact.abs().max()).item()
    assert err(ours) < 2 * err(theirs) + 1e-3


def test_query_chunked_attention_gradients_equal_timm():
    attn, ref = _randomized_talking_heads()
    x = torch.randn(2, 40, 48)
    grads = []
    for m in (attn, ref):
        xi = x.clone().requires_grad_()
        y = talking_heads_chunked(m, xi, 16) if m is attn else m(xi)
        y.pow(2).mean().backward()
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    # proj_l's bias has an exactly-zero gradient (softmax is shift-invariant), computed as rounding
    # noise by both: tolerances are relative to the largest gradient
    scale = max(w.abs().max().item() for w in grads[1])
    for g, w in zip(*grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * scale)


def test_query_chunk_dispatch(monkeypatch):
    import deepvit_mm.models.backbones.cait.window_attention as wa
    calls = []
    real = wa.talking_heads_chunked
    monkeypatch.setattr(wa, 'talking_heads_chunked',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    attn, ref = _randomized_talking_heads()
    attn.query_chunk = 16
    x = torch.randn(1, 40, 48, requires_grad=True)
    attn(x).sum().backward()  # autograd too
    assert calls == [1] and x.grad is not None
    with torch.no_grad():
        attn(x[:, :16])  # no more tokens than one chunk: timm's attention
        assert calls == [1]
        want = ref(x)
        torch.testing.assert_close(attn(x), want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
        assert calls == [1, 1]
        attn.train().attn_drop.p = 0.1  # attention dropout in training: timm's attention
        attn(x)
        assert calls == [1, 1]
        attn.eval().attn_drop.p = 0.0
        attn.query_chunk = 'auto'  # CPU: 128-row chunks, so 40 tokens stay with timm's attention
        attn(x)
        assert calls == [1, 1]
        attn.query_chunk = None
        attn(x)
        assert calls == [1, 1]


def test_cait_query_chunks_switch_and_parity(monkeypatch):
    import deepvit_mm.models.backbones.cait.window_attention as wa
    calls = []
    real = wa.talking_heads_chunked
    monkeypatch.setattr(wa, 'talking_heads_chunked',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    m = CaiT('xxs24', out_indices=EARLY).eval()
    assert m.query_chunks == 'auto'
    assert all(b.attn.query_chunk == 'auto' for b in m.trunk.blocks)
    x = torch.randn(1, 3, 224, 256)  # 14 x 16 = 224 tokens: more than one 128-row chunk
    with torch.no_grad():
        auto = m(x)
        assert len(calls) == 4  # every block's attention went by query chunks
        m.query_chunks = False
        assert all(b.attn.query_chunk is None for b in m.trunk.blocks)
        timm_out = m(x)
    for a, b in zip(auto, timm_out):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())
    with pytest.raises(ValueError, match="'auto', True or False"):
        m.query_chunks = 'yes'
