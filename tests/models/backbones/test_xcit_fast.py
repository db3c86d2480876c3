"""The fast XCiT forward (deepvit_mm.models.backbones.xcit.fast) equals timm's, forward and backward."""
import copy

import pytest
import torch
import torch.nn as nn

import deepvit_mm.models.backbones.xcit.fast as xcit_fast
from deepvit_mm import XCiT
from deepvit_mm.engine.optimizers.cpu_amp_optim_wrapper import cpu_float16_training_problem
from deepvit_mm.models.backbones.xcit.fast import xca_block_inference, xca_from_gram

pytestmark = pytest.mark.numerics  # bounds that depend on the CPU's kernels


def _randomize(m: nn.Module) -> nn.Module:
    """Non-trivial BN statistics, biases, LayerScale and temperatures, so every term counts."""
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
        if isinstance(mod, nn.Linear) and mod.bias is not None:
            mod.bias.data.normal_(0, 0.3)
    for n, p in m.named_parameters():
        if n.endswith(('gamma1', 'gamma2', 'gamma3', 'temperature')):
            p.data.uniform_(0.5, 1.5)
    return m


def _pair(arch, **kw):
    # the tests' inputs are small, where 'auto' would pick timm's forward: force the fast one
    fast = _randomize(XCiT(arch, gram_xca=True, **kw))
    ref = copy.deepcopy(fast)
    ref.gram_xca = False
    return fast, ref


@pytest.mark.parametrize('arch', ['nano_12_p16', 'nano_12_p8'])
@pytest.mark.parametrize('hw', [(64, 96), (50, 70)])
@pytest.mark.slow
def test_eval_outputs_equal_timm(arch, hw):
    """The fast eval forward's levels equal timm's forward's. XCiT-N12 built and deep-copied, a
    forward of each at batch 2."""
    fast, ref = _pair(arch)
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        got, want = fast.eval()(x), ref.eval()(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())


@pytest.mark.parametrize('qkv_bias', [True, False])
@pytest.mark.parametrize('chunk', [7, 64, 4096, None])  # ragged last, several, one, batched
def test_chunked_inference_block_equals_timm_block(chunk, qkv_bias):
    import timm
    m = _randomize(timm.create_model('xcit_nano_12_p16_224', num_classes=0)).eval()
    blk = m.blocks[2]
    if not qkv_bias:
        blk.attn.qkv.bias = None
    H, W = 6, 9
    x = torch.randn(2, H * W, 128) * 2 + 0.3
    with torch.no_grad():
        torch.testing.assert_close(xca_block_inference(blk, x, H, W, chunk=chunk), blk(x, H, W),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_eval_with_autograd_uses_the_differentiable_path():
    """In eval mode with gradients on, the input's gradient equals timm's. XCiT-N12/16 built and
    deep-copied, a forward and backward of each at 48x64."""
    # eval mode with gradients on (e.g. fine-tuning with norm_eval / frozen stages): the chunked
    # inference path must not be taken, the input gets a gradient equal to timm's
    fast, ref = _pair('nano_12_p16')
    grads = []
    for m in (fast.eval(), ref.eval()):
        x = torch.randn(1, 3, 48, 64, generator=torch.Generator().manual_seed(3), requires_grad=True)
        sum(o.pow(2).mean() for o in m(x)).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize('with_cp', [False, True])
@pytest.mark.slow
def test_training_gradients_equal_timm(with_cp):
    """Training gradients of every parameter equal timm's, drop path on. XCiT-N12/16 built and
    deep-copied, a forward and backward of each at 64x64, batch 2."""
    # drop path on: both forwards draw the same random numbers in the same order
    fast, ref = _pair('nano_12_p16', drop_path_rate=0.1, with_cp=with_cp)
    x = torch.randn(2, 3, 64, 64)
    grads = []
    for m in (fast, ref):
        m.train()
        torch.manual_seed(1)
        sum(o.pow(2).mean() for o in m(x)).backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        g, w = grads[0][n], grads[1][n]
        assert g is not None and w is not None, n
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5 * max(w.abs().max().item(), 1e-3),
                                   msg=n)


def test_bf16_autocast_as_accurate_as_timm():
    fast, ref = _pair('nano_12_p16')
    fast.eval(), ref.eval()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        exact = ref(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            ours, theirs = fast(x), ref(x)

    def err(outs):
        return max(((o.float() - e).abs().max() / e.abs().max()).item() for o, e in zip(outs, exact))
    assert err(ours) < 2 * err(theirs) + 1e-3


@pytest.mark.skipif(cpu_float16_training_problem() is not None,
                    reason=str(cpu_float16_training_problem()))
@pytest.mark.parametrize('training', [False, True])
@pytest.mark.slow
def test_float16_gram_does_not_overflow(training):
    """Over 65504 / |y|^2 tokens a float16 sum y^T y overflows (XCiT-S12/8 at 800x1344 on an H100:
    NaN outputs, the fp16 recipe's first loss NaN); the Gram matrix is formed as a mean."""
    fast, ref = _pair('nano_12_p8')
    for m in (fast, ref):
        for blk in m.trunk.blocks:
            blk.norm1.weight.data.fill_(12.)  # |y|^2 ~ 144 a channel: 1,024 tokens sum past 65504
        m.train(training)
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        exact = ref(x)
        with torch.autocast('cpu', dtype=torch.float16):
            ours, theirs = fast(x), ref(x)

    def err(outs):
        return max(((o.float() - e).abs().max() / e.abs().max()).item() for o, e in zip(outs, exact))
    assert all(o.isfinite().all() for o in ours)
    assert err(ours) < 2 * err(theirs) + 1e-3


def test_gram_attention_equals_timm_xca_with_and_without_bias():
    import timm
    m = timm.create_model('xcit_nano_12_p16_224', num_classes=0)
    attn = _randomize(m).blocks[0].attn.eval()
    x = torch.randn(2, 77, 128) * 3 + 0.5  # an offset makes the bias terms matter
    with torch.no_grad():
        torch.testing.assert_close(xca_from_gram(attn, x), attn(x), rtol=1e-4, atol=1e-5)
        attn.qkv.bias = None
        torch.testing.assert_close(xca_from_gram(attn, x), attn(x), rtol=1e-4, atol=1e-5)


def test_non_linear_qkv_falls_back_to_timm_attention():
    fast, ref = _pair('nano_12_p16')
    for m in (fast, ref):
        torch.manual_seed(2)
        m.trunk.blocks[0].attn.qkv = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 384))
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for g, w in zip(fast.eval()(x), ref.eval()(x)):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_auto_rule_cpu_threshold():
    C = 128
    assert not xcit_fast.fast_path_helps(torch.empty(4, 2 * C - 1, C))
    assert xcit_fast.fast_path_helps(torch.empty(1, 2 * C, C))


@pytest.mark.parametrize('hw, fast_expected', [((64, 64), False), ((256, 256), True)])
@pytest.mark.slow
def test_auto_takes_the_fast_path_only_where_it_helps(monkeypatch, hw, fast_expected):
    """``gram_xca='auto'`` takes the fast path where there are 2 C tokens (256x256) only, with
    timm's outputs. XCiT-N12/16 built and deep-copied, a forward of each."""
    # nano (C = 128) at /16: 16 tokens (timm's forward) or 256 = 2 C tokens (the Gram forward)
    calls = []
    real = xcit_fast.xca_block_inference

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(xcit_fast, 'xca_block_inference', spy)
    auto = _randomize(XCiT('nano_12_p16'))
    assert auto.gram_xca == 'auto'
    ref = copy.deepcopy(auto)
    ref.gram_xca = False
    x = torch.randn(1, 3, *hw)
    with torch.no_grad():
        got, want = auto.eval()(x), ref.eval()(x)
    assert len(calls) == (12 if fast_expected else 0)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * w.abs().max().item())


def test_gram_xca_switch_validates_and_restores_timm():
    m = XCiT('nano_12_p16')
    with pytest.raises(ValueError, match="'auto', True or False"):
        m.gram_xca = 'fast'
    m.gram_xca = False
    assert all('forward' not in blk.__dict__ for blk in m.trunk.blocks)
    m.gram_xca = True
    assert all(blk.forward.__func__ is xcit_fast.xca_block_forward for blk in m.trunk.blocks)
