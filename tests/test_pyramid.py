"""The pyramid adapter's contract: levels per patch size, output strides, readable errors."""
import pytest
import torch
import torch.nn as nn

from deepvit_mm import ColumnarPyramid
from deepvit_mm.pyramid import ConvTranspose2x2


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


@pytest.mark.parametrize('autocast', [False, True])
def test_gemm_transposed_conv_matches_pytorch(autocast):
    """The CPU GEMM + pixel-shuffle form equals nn.ConvTranspose2d: outputs and all gradients."""
    torch.manual_seed(0)
    ref = nn.ConvTranspose2d(12, 8, kernel_size=2, stride=2)
    ours = ConvTranspose2x2(12, 8)
    ours.load_state_dict(ref.state_dict())  # same keys and shapes: checkpoints load unchanged
    x = torch.randn(2, 12, 5, 7, requires_grad=True)
    g = torch.randn(2, 8, 10, 14)
    grads = []
    for m in (ref, ours):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            y = m(x)
        grads.append((y.detach().float(), *torch.autograd.grad(y, (x, m.weight, m.bias), g.to(y.dtype))))
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    assert grads[1][0].shape == (2, 8, 10, 14)
    for a, b in zip(*grads[:3]):
        torch.testing.assert_close(b.float(), a.float(), **tol)
    # the bias gradient is a sum over 280 terms, compared with the exact sum: under bf16 autocast
    # both kernels within one bf16 ulp of it (a bf16 accumulation is 16 ulps off)
    exact = g.to(torch.bfloat16 if autocast else torch.float32).double().sum((0, 2, 3))
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs())) - 7) if autocast else 1e-5 * exact.abs()
    for name, grad in (('nn.ConvTranspose2d', grads[0][3]), ('ConvTranspose2x2', grads[1][3])):
        assert ((grad.double() - exact).abs() <= ulp).all(), name


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
