"""What only timm's families (``TimmViT``, ``TimmEVA``, ``TimmBEiT``) have: the arch table that is
timm's registry, ViTDet's simple pyramid, BEiT's one grid, patch 14's resampled taps, timm
checkpoints of another resolution and hub names through the one loader, mixed precision, layer
decay and FSDP units. Shapes, gradients, ``with_cp``, freezing, ``norm_eval``, input checks and
parity with timm's ``forward_intermediates`` are test_backbones.py's, for every family.
"""
import pytest
import timm
import torch
from conftest import EARLY, SMALL_GRID, TIMM_FAMILY_ARCHS, randomize_
from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS
from timm.layers import resample_abs_pos_embed

from deepvit_mm import TimmBEiT, TimmEVA, TimmViT
from deepvit_mm.engine.distributed.fsdp import columnar_block_policy
from deepvit_mm.engine.optimizers.cpu_amp_optim_wrapper import cpu_float16_training_problem
from deepvit_mm.engine.optimizers.optim_wrapper_constructors import layer_ids
from deepvit_mm.models.backbones.timm_releases import create_model
from deepvit_mm.utils import meta_device

FAMILIES = {'TimmViT': TimmViT, 'TimmEVA': TimmEVA, 'TimmBEiT': TimmBEiT}
SMALLEST = {name: archs[0] for name, archs in TIMM_FAMILY_ARCHS.items()}
# the timm class each family is built on
TIMM_CLASSES = {'TimmViT': ('VisionTransformer', 'VisionTransformerDistilled'),
                'TimmEVA': ('Eva',), 'TimmBEiT': ('Beit',)}


def _small(family, **kwargs):
    """The family's smallest arch, its first 4 blocks; BEiT built for small inputs (``SMALL_GRID``)
    where ``img_size`` is not given."""
    kwargs = {'out_indices': EARLY, **SMALL_GRID.get(family, {}), **kwargs}
    return FAMILIES[family](SMALLEST[family], **kwargs)


# ------------------------------------------------------------------------------ the arch table
@pytest.mark.parametrize('family', FAMILIES)
def test_every_name_of_the_timm_modules_is_an_arch(family):
    fam = FAMILIES[family]
    names = [n for m in fam.arch_zoo.modules for n in timm.list_models(module=m)]
    assert names and sorted(names) == list(fam.arch_zoo) and len(fam.arch_zoo) == len(names)
    assert all(fam.arch_zoo.resolve(n, family) == n for n in names)
    assert set(fam.arch_zoo.examples) <= set(names) and set(TIMM_FAMILY_ARCHS[family]) <= set(names)
    # no other family's name: each family one timm module (set)
    for other, o in FAMILIES.items():
        if other != family:
            assert not set(names) & set(o.arch_zoo)


@pytest.mark.parametrize('family', FAMILIES)
def test_arch_spec_is_timms_model(family):
    """The table's width, depth, heads and patch of the largest example are those of timm's model
    (built on the meta device, as the table reads them); the taps are the XCiT paper's."""
    fam = FAMILIES[family]
    name = fam.arch_zoo.examples[-1]
    spec = fam.arch_zoo[name]
    with meta_device():  # (timm 1.0.16 builds on the meta device through timm_releases)
        ref = create_model(name, num_classes=0)
    assert type(ref).__name__ in TIMM_CLASSES[family]
    assert (spec.embed_dim, spec.depth, spec.num_heads, spec.patch_size) == (
        ref.embed_dim, len(ref.blocks), ref.blocks[0].attn.num_heads, ref.patch_embed.patch_size[0])
    depth = spec.depth
    assert spec.out_indices == tuple(depth * k // 12 - 1 for k in (4, 6, 8, 12))
    assert spec.tap_stride == (16 if spec.patch_size == 14 else spec.patch_size)
    with meta_device():
        m = fam(name)
    assert type(m.trunk).__name__ in TIMM_CLASSES[family]
    assert len(m.trunk.blocks) == depth and m.out_indices == spec.out_indices


@pytest.mark.parametrize('family', FAMILIES)
def test_unknown_name_lists_the_timm_modules(family):
    fam = FAMILIES[family]
    with pytest.raises(ValueError, match=rf"unknown arch 'xcit_nano_12_p16_224'.*timm's "
                                         rf"{fam.arch_zoo.modules[0]}"):
        fam('xcit_nano_12_p16_224')
    with pytest.raises(ValueError, match='embed_dim is fixed by arch'):
        fam(SMALLEST[family], embed_dim=64)


# ------------------------------------------------------------------------------ the pyramids
@pytest.mark.parametrize('family', FAMILIES)
def test_simple_pyramid_rescales_one_tap(family):
    m = _small(family, pyramid='simple', out_indices=(3,)).eval()
    assert m.out_indices == (3,) and len(m.trunk.blocks) == 4
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        outs = m(x)
        H, W = m._padded_size(64, 96)
        tap = m._forward_taps(torch.nn.functional.pad(x, (0, W - 96, 0, H - 64)))
    assert [tuple(o.shape) for o in outs] == [(1, m.embed_dim, H // s, W // s)
                                              for s in (4, 8, 16, 32)]
    assert len(tap) == 1
    torch.testing.assert_close(outs[2], tap[0], rtol=0, atol=0)  # stride 16: the tap itself
    torch.testing.assert_close(outs[3], torch.nn.functional.max_pool2d(tap[0], 2), rtol=0, atol=0)
    # the default: the last block
    with meta_device():
        assert FAMILIES[family](SMALLEST[family], pyramid='simple').out_indices == \
            (m.arch_zoo[m.arch].depth - 1,)


def test_pyramid_choice_and_its_taps_are_checked():
    with pytest.raises(ValueError, match="pyramid='vitdet' must be 'columnar'"):
        _small('TimmViT', pyramid='vitdet')
    with pytest.raises(ValueError, match='one tap per level'):
        _small('TimmViT', pyramid='simple', out_indices=(2, 3))
    # the paper families take it too
    from deepvit_mm import XCiT
    with meta_device():
        m = XCiT('nano_12_p16', pyramid='simple')
    assert m.out_indices == (11,) and len(m.adapter.levels) == 4


# ------------------------------------------------------------------------------ sizes
def test_patch_14_taps_are_resampled_to_the_16_pixel_grid():
    m = _small('TimmEVA').eval()  # test_eva: patch 14
    assert (m.patch_size, m.tap_stride) == (14, 16)
    with torch.no_grad():
        outs = m(torch.randn(2, 3, 70, 100))  # padded to 96 x 128: 7 x 10 patches of 14 (padded)
    assert [tuple(o.shape[-2:]) for o in outs] == [(96 // s, 128 // s) for s in (4, 8, 16, 32)]


def test_beit_pads_to_its_size_and_refuses_a_larger_input():
    m = TimmBEiT(SMALLEST['TimmBEiT'], out_indices=EARLY, img_size=64).eval()
    with torch.no_grad():
        outs = m(torch.randn(1, 3, 50, 40))
    assert [tuple(o.shape[-2:]) for o in outs] == [(64 // s, 64 // s) for s in (4, 8, 16, 32)]
    with pytest.raises(ValueError, match=r'larger than the 64x64.*img_size=96'):
        m(torch.randn(1, 3, 70, 64))
    with pytest.raises(ValueError, match=r'img_size=\(48, 48\) must be a multiple of .* 32'):
        TimmBEiT(SMALLEST['TimmBEiT'], out_indices=EARLY, img_size=48)
    unpadded = TimmBEiT(SMALLEST['TimmBEiT'], out_indices=EARLY, img_size=64, pad_input=False)
    with pytest.raises(ValueError, match='must be 64x64'):
        unpadded(torch.randn(1, 3, 64, 96))


@pytest.mark.parametrize('family', ['TimmViT', 'TimmEVA'])
def test_any_input_size_resamples_the_position_embedding(family):
    """ViT and EVA-02 take inputs far from their built resolution; the stored embedding keeps
    its shape (DDP's hooks see it once)."""
    m = _small(family).eval()
    shape = tuple(m.trunk.pos_embed.shape)
    for hw in [(32, 32), (64, 320), (250, 90)]:
        with torch.no_grad():
            outs = m(torch.randn(1, 3, *hw))
        H, W = m._padded_size(*hw)
        assert tuple(outs[0].shape[-2:]) == (H // 4, W // 4)
        assert all(torch.isfinite(o).all() for o in outs)
    assert tuple(m.trunk.pos_embed.shape) == shape


# ------------------------------------------------------------------------------ precision
@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('dtype', [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.skipif(
    cpu_float16_training_problem() is not None, reason=str(cpu_float16_training_problem())))],
    ids=['bf16', 'fp16'])
def test_mixed_precision_close_to_float32(family, dtype):
    m = randomize_(_small(family, img_size=64)).eval() if family == 'TimmBEiT' else \
        randomize_(_small(family)).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = m(x)
        with torch.autocast('cpu', dtype=dtype):
            low = m(x)
    for r, lo in zip(ref, low):
        assert torch.isfinite(lo).all()
        err = (lo.float() - r).norm() / r.norm()
        assert err < 0.05, (family, float(err))


# ------------------------------------------------------------------------------ weights
def _timm_reference(family, img_size=None):
    """timm's model of the family's smallest arch (4 blocks), random weights."""
    torch.manual_seed(0)
    kw = {'img_size': img_size} if img_size else {}
    ref = timm.create_model(SMALLEST[family], num_classes=0, depth=len(EARLY),
                            **FAMILIES[family].trunk_options, **kw)
    randomize_(ref)
    return ref.eval()


@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.parametrize('fmt', ['pth', 'safetensors'])
def test_timm_checkpoint_loads_with_one_report(tmp_path, family, fmt):
    """timm's own checkpoint of each timm family loads with one report (BEiT's, both at
    ``SMALL_GRID``)."""
    from safetensors.torch import save_file
    ref = _timm_reference(family, **SMALL_GRID.get(family, {}))
    path = tmp_path / f'model.{fmt}'
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    save_file(sd, str(path)) if fmt == 'safetensors' else torch.save(sd, str(path))
    m = _small(family)
    report = m.load_pretrained(str(path))
    trunk = {k for k in m.state_dict() if k.startswith('trunk.')}
    assert set(report.loaded) == trunk, set(report.loaded) ^ trunk
    assert not report.skipped and not report.resized
    assert all(k.startswith('adapter.') for k in report.left_at_init)
    assert all(k.startswith(('trunk.norm.', 'trunk.fc_norm.', 'trunk.head.')) for k in report.dropped)
    x = torch.randn(1, 3, *(m.img_size if family == 'TimmBEiT' else (64, 96)))
    with torch.no_grad():
        want = ref.forward_intermediates(x, indices=list(EARLY), intermediates_only=True)
        got = m.eval()._forward_taps(x)
    for g, w in zip(got, want):
        if m.tap_stride != m.patch_size:  # EVA-02's patch 14: resampled to the 16-pixel grid
            w = torch.nn.functional.interpolate(w, size=g.shape[-2:], mode='bilinear',
                                                align_corners=False)
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('family', FAMILIES)
def test_checkpoint_of_another_resolution_is_resized_by_timms_filter(tmp_path, family):
    """A checkpoint trained at 224 into a backbone built for 128 (ViT, EVA-02: the absolute
    position embedding resampled as timm's filter does; BEiT: its relative position bias
    tables)."""
    ref = _timm_reference(family)
    torch.save(ref.state_dict(), str(tmp_path / 'model.pth'))
    m = _small(family, img_size=128)
    report = m.load_pretrained(str(tmp_path / 'model.pth'))
    assert not report.skipped
    sd = m.state_dict()
    if family == 'TimmBEiT':
        key = 'trunk.blocks.0.attn.relative_position_bias_table'
        assert sd[key].shape != ref.state_dict()[key[6:]].shape
        assert key in report.loaded
    else:
        prefix = ref.num_prefix_tokens if not getattr(ref, 'no_embed_class', False) else 0
        grid = m.trunk.patch_embed.grid_size  # 128 / 16 = 8, 128 // 14 = 9
        want = resample_abs_pos_embed(ref.pos_embed.detach(), new_size=grid, num_prefix_tokens=prefix)
        torch.testing.assert_close(sd['trunk.pos_embed'], want)


@pytest.mark.slow
def test_hub_name_from_an_offline_cache(tmp_path):
    """``hf-hub:timm/<name>.<tag>`` of a timm family, read from the Hugging Face cache offline."""
    from checkpoints.test_integrity import _hf_cache, _offline
    from safetensors.torch import save_file
    ref = _timm_reference('TimmViT')
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
              str(tmp_path / 'model.safetensors'))
    _hf_cache(tmp_path / 'hf' / 'hub', 'timm/vit_tiny_patch16_224.augreg_in21k',
              {'model.safetensors': (tmp_path / 'model.safetensors').read_bytes(),
               'config.json': b'{}'})
    torch.save(ref.state_dict(), str(tmp_path / 'want.pth'))
    code = ('import torch, deepvit_mm; from mmseg.registry import MODELS\n'
            'm = MODELS.build(dict(type="TimmViT", arch="vit_tiny_patch16_224", out_indices=(0, 1, 2, 3),'
            ' init_cfg=dict(type="Pretrained",'
            ' checkpoint="hf-hub:timm/vit_tiny_patch16_224.augreg_in21k"))); m.init_weights()\n'
            f'want = torch.load({str(tmp_path / "want.pth")!r})\n'
            'print(all(torch.equal(m.state_dict()["trunk." + k], v) for k, v in want.items() '
            'if "trunk." + k in m.state_dict()))\n')
    out = _offline(code, tmp_path / 'hf')
    assert out.returncode == 0 and out.stdout.strip().endswith('True'), out.stderr[-3000:]
    loaded = len([k for k in ref.state_dict() if not k.startswith('norm.')])  # 52: its norm dropped
    assert f'loaded {loaded} tensors' in out.stdout + out.stderr, out.stdout + out.stderr[-3000:]


# ------------------------------------------------------------------------------ training
@pytest.mark.parametrize('family', FAMILIES)
def test_layer_decay_and_fsdp_units_take_the_blocks(family):
    m = _small(family)
    ids, num_blocks = layer_ids(m)
    assert num_blocks == 4
    for name, layer in ids.items():
        if name.startswith('trunk.blocks.'):
            assert layer == int(name.split('.')[2]) + 1, name
        elif name.startswith('trunk.'):  # embeddings, tokens
            assert layer == 0, name
        else:
            assert layer == num_blocks + 1, name
    assert any(n in ids for n in ('trunk.cls_token', 'trunk.pos_embed'))
    assert all(columnar_block_policy(b, recurse=False) for b in m.trunk.blocks)
    assert not columnar_block_policy(m.trunk.patch_embed, recurse=False)
    assert not columnar_block_policy(m.adapter, recurse=False)


@pytest.mark.parametrize('registry', [MMDET_MODELS, MMSEG_MODELS], ids=['mmdet', 'mmseg'])
def test_registered_in_both_libraries(registry):
    for name, fam in FAMILIES.items():
        assert registry.get(name) is fam


# ------------------------------------------------------------------------------ ViTDet's windows
def test_windowed_attention_is_timms_attention_on_each_window():
    """A windowed block's attention takes the token grid (from its input's shape, nothing set on
    it per call) and is timm's attention on each window; a global block's on the whole grid."""
    m = randomize_(TimmViT(SMALLEST['TimmViT'], window_size=4, out_indices=EARLY)).eval()
    assert m.global_blocks == (2,) and m.trunk.num_prefix_tokens == 0
    windowed, whole = m.trunk.blocks[0].attn, m.trunk.blocks[2].attn
    assert type(windowed).__name__ == type(whole).__name__ == 'WindowedAttention'
    assert (windowed.window_size, whole.window_size) == (4, 0)
    assert set(vars(windowed)) == set(vars(whole))  # no state beyond timm's and the window size
    # a 6 x 10 grid in 4 x 4 windows: padded to 8 x 12, 2 x 3 windows
    x = torch.randn(2, 6, 10, m.embed_dim)
    attention = timm.models.vision_transformer.Attention.forward
    with torch.no_grad():
        got = windowed(x)
        grid = torch.nn.functional.pad(x, (0, 0, 0, 2, 0, 2))
        want = torch.empty_like(grid)
        for i in range(0, 8, 4):
            for j in range(0, 12, 4):
                win = grid[:, i:i + 4, j:j + 4].reshape(2, 16, -1)
                want[:, i:i + 4, j:j + 4] = attention(windowed, win).view(2, 4, 4, -1)
        torch.testing.assert_close(got, want[:, :6, :10], rtol=1e-5, atol=1e-6)
        assert torch.equal(whole(x), attention(whole, x.reshape(2, 60, -1)).view(x.shape))
        tokens = x.reshape(2, 60, -1)  # tokens: timm's attention itself
        assert torch.equal(windowed(tokens), attention(windowed, tokens))


def test_windowed_vit_trains_and_checkpoints_like_the_global_one():
    kw = dict(window_size=4, out_indices=EARLY, drop_path_rate=0.0)
    ref = randomize_(TimmViT(SMALLEST['TimmViT'], **kw)).train()
    cp = TimmViT(SMALLEST['TimmViT'], with_cp=True, **kw).train()
    cp.load_state_dict(ref.state_dict())
    x = torch.randn(1, 3, 96, 160)  # 6 x 10 patches: windows padded
    outs = []
    for m in (ref, cp):
        out = m(x)
        sum(o.square().mean() for o in out).backward()
        outs.append(out)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    grads = dict(cp.named_parameters())
    for n, p in ref.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
        torch.testing.assert_close(grads[n].grad, p.grad, rtol=1e-5, atol=1e-7, msg=n)


def test_windowed_vit_takes_a_class_token_checkpoint(tmp_path):
    """ViTDet's start: an MAE / ImageNet ViT with a class token into a trunk of patch tokens only.
    The class token is dropped on purpose; the position embedding keeps the patches' entries,
    resampled to the built grid by timm's filter."""
    ref = _timm_reference('TimmViT')  # class token, pos_embed (1, 1 + 14 * 14, C)
    torch.save(ref.state_dict(), str(tmp_path / 'mae.pth'))
    m = TimmViT(SMALLEST['TimmViT'], window_size=4, out_indices=EARLY, img_size=128)
    report = m.load_pretrained(str(tmp_path / 'mae.pth'))
    assert 'trunk.cls_token' in report.dropped and not report.skipped
    want = resample_abs_pos_embed(ref.pos_embed.detach()[:, 1:], new_size=(8, 8),
                                  num_prefix_tokens=0)
    torch.testing.assert_close(m.state_dict()['trunk.pos_embed'], want)


def test_window_arguments_are_checked():
    with pytest.raises(ValueError, match='window_size=-1 must be 0'):
        TimmViT(SMALLEST['TimmViT'], window_size=-1)
    with pytest.raises(ValueError, match='needs window_size > 0'):
        TimmViT(SMALLEST['TimmViT'], global_blocks=(1,))
    with pytest.raises(ValueError, match='strictly increasing'):
        TimmViT(SMALLEST['TimmViT'], window_size=4, global_blocks=(3, 1))
    with pytest.raises(ValueError, match='window_size needs a trunk of patch tokens only'):
        TimmViT('deit_tiny_distilled_patch16_224', window_size=4, out_indices=EARLY)
