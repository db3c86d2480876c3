"""XCiT backbone: parity with timm, shapes/strides, gradients, arch names, input checks."""
import pytest
import timm
import torch

from deepvit_mm import XCiT

ALL_ARCHS = list(XCiT.arch_zoo)
SMALL_ARCHS = ['nano_12_p8', 'nano_12_p16', 'tiny_12_p8', 'tiny_12_p16', 'tiny_24_p16']


def _timm_twin(backbone: XCiT) -> torch.nn.Module:
    """timm's own model with the backbone's trunk weights."""
    ref = timm.create_model(backbone.arch_zoo[backbone.arch].timm, num_classes=0)
    trunk_sd = {k[6:]: v for k, v in backbone.state_dict().items() if k.startswith('trunk.')}
    missing, unexpected = ref.load_state_dict(trunk_sd, strict=False)
    assert not unexpected
    assert all(k.startswith(('cls_attn_blocks', 'cls_token', 'norm.')) for k in missing)
    return ref.eval()


@pytest.mark.parametrize('arch', SMALL_ARCHS)
@pytest.mark.parametrize('hw', [(64, 64), (64, 96)])
def test_taps_equal_timm_intermediates(arch, hw):
    m = XCiT(arch).eval()
    # non-trivial BN statistics so the comparison covers them
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    ref = _timm_twin(m)
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        want = ref.forward_intermediates(x, indices=list(m.out_indices), intermediates_only=True)
        got = m._forward_taps(x)
    assert len(got) == 4
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('arch', ALL_ARCHS)
def test_every_arch_builds_like_timm(arch):
    m = XCiT(arch)
    spec = m.arch_zoo[arch]
    ref_blocks = 12 if '_12_' in arch else 24
    assert m.depth == ref_blocks == len(m.trunk.blocks)
    assert m.trunk.embed_dim == spec.embed_dim
    assert m.trunk.patch_embed.patch_size == spec.patch_size
    assert m.out_indices == ((3, 5, 7, 11) if ref_blocks == 12 else (7, 11, 15, 23))
    # paper Table B.1: LayerScale init and stochastic depth
    assert torch.all(m.trunk.blocks[0].gamma1 == spec.eta)
    dp = m.trunk.blocks[0].drop_path1
    assert (getattr(dp, 'drop_prob', 0.0)) == pytest.approx(spec.drop_path_rate)
    # class attention, class token, final norm and head are not built
    assert m.trunk.cls_attn_blocks is None and m.trunk.cls_token is None
    assert not any(k.startswith(('trunk.head', 'trunk.norm.', 'trunk.cls')) for k in m.state_dict())
    assert m.out_channels == [spec.embed_dim] * 4


def test_table_b1_values():
    z = XCiT.arch_zoo
    assert (z['small_12_p8'].drop_path_rate, z['small_12_p8'].eta) == (0.05, 1.0)
    assert (z['tiny_24_p16'].drop_path_rate, z['tiny_24_p16'].eta) == (0.05, 1e-5)
    assert (z['medium_24_p8'].drop_path_rate, z['medium_24_p8'].eta) == (0.15, 1e-5)
    assert z['large_24_p16'].drop_path_rate == 0.25 and z['large_24_p8'].drop_path_rate == 0.3
    assert len(z) == 14


@pytest.mark.parametrize('arch', ['nano_12_p8', 'nano_12_p16'])
@pytest.mark.parametrize('hw', [(64, 64), (96, 160), (70, 45), (33, 100)])
def test_output_shapes_and_strides(arch, hw):
    m = XCiT(arch).eval()
    with torch.no_grad():
        outs = m(torch.randn(1, 3, *hw))
    H, W = (-(-hw[0] // 32) * 32, -(-hw[1] // 32) * 32)  # padded to a multiple of 32
    assert [tuple(o.shape) for o in outs] == [(1, 128, H // s, W // s) for s in (4, 8, 16, 32)]
    assert m.out_strides == (4, 8, 16, 32)
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('arch', ['nano_12_p8', 'nano_12_p16', 'tiny_24_p8'])
def test_every_trainable_parameter_gets_a_gradient(arch):
    m = XCiT(arch, drop_path_rate=0.0).train()  # a dropped branch has no gradient by design
    outs = m(torch.randn(2, 3, 64, 96))
    sum(o.float().pow(2).mean() for o in outs).backward()
    no_grad = [n for n, p in m.named_parameters() if p.requires_grad and
               (p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0)]
    assert not no_grad, no_grad


def test_timm_names_and_tags_accepted():
    assert XCiT.resolve_arch('xcit_small_12_p8_224') == 'small_12_p8'
    assert XCiT.resolve_arch('xcit_medium_24_p16_384.fb_in1k') == 'medium_24_p16'
    assert XCiT.resolve_arch('xcit_tiny_12_p8_224_dist') == 'tiny_12_p8'
    assert XCiT.resolve_arch('NANO_12_P16') == 'nano_12_p16'


def test_unknown_arch_is_refused_with_suggestion():
    with pytest.raises(ValueError, match=r"unknown arch 'small_12_p4'.*Did you mean.*Valid"):
        XCiT('small_12_p4')
    with pytest.raises(ValueError, match='unknown arch'):
        XCiT('xcit_huge_48_p8_224')


@pytest.mark.parametrize('bad', [(3, 5, 7, 12), (5, 3, 7, 11), (3, 3, 7, 11), (-1, 5, 7, 11)])
def test_bad_out_indices_refused(bad):
    with pytest.raises(ValueError, match='out_indices'):
        XCiT('nano_12_p16', out_indices=bad)


def test_out_indices_count_must_match_levels():
    with pytest.raises(ValueError, match='one tap per level'):
        XCiT('nano_12_p16', out_indices=(3, 7, 11))


def test_custom_out_indices_prune_blocks():
    m = XCiT('nano_12_p16', out_indices=(1, 3, 5, 7))
    assert len(m.trunk.blocks) == 8


def test_bad_inputs_refused():
    m = XCiT('nano_12_p16').eval()
    with pytest.raises(ValueError, match='3-channel images, got 1'):
        m(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='smaller than one 16x16 patch'):
        m(torch.randn(1, 3, 8, 64))
    with pytest.raises(ValueError, match=r'\(B, C, H, W\)'):
        m(torch.randn(3, 64, 64))


def test_syncbn_norm_cfg_replaces_trunk_batchnorms():
    m = XCiT('nano_12_p16', norm_cfg=dict(type='SyncBN', requires_grad=True))
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    assert bns and all(isinstance(b, torch.nn.SyncBatchNorm) for b in bns)
