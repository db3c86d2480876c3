"""ColumnarPyramid's contract: levels per patch size, output strides, readable errors."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from deepvit_mm import ColumnarPyramid
from deepvit_mm.models.backbones.columnar_pyramid import ConvTranspose2x2


def _kinds(level):
    return [type(m).__name__ for m in (level if isinstance(level, nn.Sequential) else [level])]


def test_patch8_levels():
    p = ColumnarPyramid(32, in_stride=8)
    assert [_kinds(level) for level in p.levels] == [
        ['ConvTranspose2x2'], ['Identity'], ['MaxPool2d'], ['MaxPool2d']]
    assert p.levels[2][0].kernel_size == 2 and p.levels[3][0].kernel_size == 4


def test_patch16_levels_match_official_layout():
    p = ColumnarPyramid(32, in_stride=16)
    assert [_kinds(level) for level in p.levels] == [
        ['ConvTranspose2x2', 'BatchNorm2d', 'GELU', 'ConvTranspose2x2'], ['ConvTranspose2x2'],
        ['Identity'], ['MaxPool2d']]
    conv = p.levels[0][0]
    assert conv.kernel_size == (2, 2) and conv.stride == (2, 2)
    # official XCiT detection keys fpn1.0/fpn1.1/fpn1.3, fpn2.0 map onto levels.0.*, levels.1.*
    keys = set(p.state_dict())
    assert {'levels.0.0.weight', 'levels.0.1.running_mean', 'levels.0.3.weight',
            'levels.1.0.weight'} <= keys


@pytest.mark.parametrize('stride', [8, 16])
@pytest.mark.parametrize('hw', [(4, 4), (8, 12), (4, 20)])  # the backbone pads to 32
def test_output_strides(stride, hw):
    p = ColumnarPyramid(8, in_stride=stride).eval()
    feats = [torch.randn(2, 8, *hw) for _ in range(4)]
    outs = p(feats)
    for s, o in zip((4, 8, 16, 32), outs):
        assert o.shape[-2:] == (hw[0] * stride // s, hw[1] * stride // s)


def _transposed_conv_case():
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(12, 8, kernel_size=2, stride=2)
    ours = ConvTranspose2x2(12, 8)
    ours.load_state_dict(ref.state_dict())  # same keys and shapes: checkpoints load unchanged
    return ref, ours, torch.randn(2, 12, 5, 7, requires_grad=True), torch.randn(2, 8, 10, 14)


def _output_and_grads(m, x, g, autocast=False):
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        y = m(x)
    return (y, *torch.autograd.grad(y, (x, m.weight, m.bias), g.to(y.dtype)))


def test_gemm_transposed_conv_matches_pytorch():
    """The CPU GEMM + pixel-shuffle form equals nn.ConvTranspose2d in float32: outputs and all
    gradients."""
    ref, ours, x, g = _transposed_conv_case()
    want, got = _output_and_grads(ref, x, g), _output_and_grads(ours, x, g)
    assert got[0].shape == (2, 8, 10, 14)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.numerics
def test_gemm_transposed_conv_under_bf16_autocast_is_within_bf16_rounding():
    """Under CPU bf16 autocast, the output and the input and weight gradients are within two bf16
    roundings (2 ** -7 of the magnitudes summed) of the exact float64 transposed convolution of the
    same bf16 operands, and the bias gradient, a sum over 280 terms, within one bf16 ulp of its
    exact sum (summed in float32; a bf16 accumulation is 16 ulps off). The reference is exact, not
    torch's own bf16 kernel, whose accumulation differs by CPU and release (torch 2.1.2 on an
    AVX2-only CPU: more than one ulp off the bias gradient)."""
    _, ours, x, g = _transposed_conv_case()
    y, gx, gw, gb = _output_and_grads(ours, x, g, autocast=True)
    assert y.dtype == torch.bfloat16 and gb.dtype == torch.float32

    def exact(absolute):
        f = (lambda t: t.bfloat16().double().abs()) if absolute else (lambda t: t.bfloat16().double())
        xd, wd, bd, gd = (f(t.detach()).requires_grad_(r) for t, r in (
            (x, True), (ours.weight, True), (ours.bias, False), (g, False)))
        out = F.conv_transpose2d(xd, wd, bd, stride=2)
        return (out, *torch.autograd.grad(out, (xd, wd), gd))

    bounds = [2 ** -7 * m + 1e-6 for m in exact(absolute=True)]
    for name, got, want, bound in zip(('output', 'input grad', 'weight grad'), (y, gx, gw),
                                      exact(absolute=False), bounds):
        err = (got.double() - want.detach()).abs()
        assert (err <= bound).all(), f'{name}: {(err / bound).max():.2f}x the bound'
    exact_sum = g.bfloat16().double().sum((0, 2, 3))
    ulp = torch.exp2(torch.floor(torch.log2(exact_sum.abs())) - 7)
    assert ((gb.double() - exact_sum).abs() <= ulp).all()


def test_gemm_transposed_conv_inference_in_row_steps():
    """Without autograd the CPU form runs a few input rows at a time: same output, any height."""
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(6, 4, kernel_size=2, stride=2)
    ours = ConvTranspose2x2(6, 4)
    ours.load_state_dict(ref.state_dict())
    ours.INFERENCE_ROWS_PER_STEP = 3  # 7 rows: steps of 3, 3 and 1
    x = torch.randn(2, 6, 7, 5)
    with torch.no_grad():
        out = ours(x)
        torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-5)
    assert out.shape == (2, 4, 14, 10)


def test_wrong_number_of_features():
    p = ColumnarPyramid(8, in_stride=16)
    with pytest.raises(ValueError, match='expects 4 feature maps.*got 3'):
        p([torch.randn(1, 8, 4, 4)] * 3)


def test_strides_must_be_powers_of_two():
    with pytest.raises(ValueError, match='powers of two'):
        ColumnarPyramid(8, in_stride=12)
    with pytest.raises(ValueError, match='powers of two'):
        ColumnarPyramid(8, in_stride=16, out_strides=(4, 8, 24, 32))
