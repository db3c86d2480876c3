"""What the harness counts: the GEMM floor and each operator's FLOPs and bytes (the roofline)."""
import pytest
import torch

from deepvit_tools import benchmark as bm
from deepvit_tools.benchmark.roofline import pass_cost


def test_gemm_floor_has_the_block_gemms_of_the_model():
    ours = bm.models.build_backbone('nano_12_p16', out_indices=(1, 3, 5, 7))  # 8 blocks, C = 128
    floor = bm.baselines.GemmFloor(ours, (64, 80), batch=2)  # padded 64x96: 4x6 = 24 tokens per image
    assert floor.tokens == 48 and floor.blocks == 8
    assert floor.multiply_adds == 8 * 12 * 48 * 128 ** 2
    acc, last = floor(bm.batches.backbone_input((64, 80), 2))
    (acc + last.mean()).backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in floor.weights)


@pytest.mark.parametrize('kwargs,spans', [
    # xxs24: C = 192, 4 heads of 48; 64x96 -> a 4x6 grid of 16-pixel patches
    (dict(out_indices=(0, 1, 2, 3)), [(8, 24, 48)] * 4),  # global attention: all 24 tokens
    (dict(out_indices=(0, 1, 2, 3), window_size=3, global_blocks=(1, 3)),
     [(8 * 4, 9, 48), (8, 24, 48)] * 2),  # 3x3 windows: 2x2 of them on the padded grid
])
@pytest.mark.slow
def test_gemm_floor_has_cait_attention_products(kwargs, spans):
    """CaiT's GEMM floor counts its attention products, global or windowed, and runs them as bmm/mm.
    Builds CaiT-XXS24's first 4 blocks and the floor, one profiled call at 64x96, batch 2."""
    ours = bm.models.build_backbone('xxs24', **kwargs)
    floor = bm.baselines.GemmFloor(ours, (64, 96), batch=2)
    assert floor.spans == spans
    assert floor.multiply_adds == 4 * 12 * 48 * 192 ** 2 + sum(2 * g * n * n * d
                                                                for g, n, d in spans)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        floor(bm.batches.backbone_input((64, 96), 2))
    ops = {e.key: e.count for e in prof.key_averages()}
    assert ops['aten::bmm'] == 2 * 4 and ops['aten::mm'] == 4 * 4


def test_pass_cost_counts_the_products_and_bytes_of_each_operator():
    m, k, n = 64, 32, 16
    lin, x = torch.nn.Linear(k, n), torch.randn(m, k)
    fwd = pass_cost(lambda: lin(x))
    # addmm(bias, x, weight.t()): 2mkn FLOPs; reads bias, x and the weight, writes the output
    assert fwd['flops'] == 2 * m * k * n
    assert fwd['bytes'] == 4 * (n + m * k + k * n + m * n)
    assert [op[0] for op in fwd['ops']] == ['addmm']  # the transposing view moves nothing
    xg = x.clone().requires_grad_()
    train = pass_cost(lambda: lin(xg).sum().backward())
    assert train['flops'] == 3 * fwd['flops']  # the backward's two products are counted
    assert {op[3] for op in train['ops'] if op[1]} == {torch.float32}
    # in place (XCiT's fast path): no formula in FlopCounterMode, counted all the same
    out, w = torch.zeros(m, n), torch.randn(k, n)
    inplace = pass_cost(lambda: out.addmm_(x, w))
    assert inplace['flops'] == 2 * m * k * n


def test_roofline_sums_each_operator_at_its_limit():
    from deepvit_tools.benchmark.flops import Op
    ops = [Op('mm', 2e12, 1e9, torch.bfloat16), Op('add', 0, 3e9, torch.float32),
           Op('mm', 1e12, 1e9, torch.float16)]  # no float16 rate measured: the fastest one
    cost = dict(ops=ops, flops=3e12, bytes=5e9)
    r = bm.roofline(cost, {torch.bfloat16: 1e12, torch.float32: 0.5e12, 'copy': 1e12})
    assert r['roofline_ms'] == pytest.approx((2 + 3e-3 + 1) * 1e3)
    assert r['compute_ms'] == pytest.approx(3e3) and r['memory_ms'] == pytest.approx(5.0)
    assert (r['gflop'], r['gbyte']) == (3e3, 5.0)
    rates = bm.device_rates('cpu', (torch.float32,), n=128, repeats=1)
    assert rates.keys() == {torch.float32, 'copy'} and min(rates.values()) > 0
    rates = bm.device_rates('cpu', (torch.float32, torch.bfloat16), n=96, repeats=1)
    assert rates.keys() == {torch.float32, torch.bfloat16, 'copy'} and min(rates.values()) > 0


@pytest.mark.parametrize('groups', [1, 4, 8])
def test_convolution_backward_counts_the_products_of_its_groups(groups):
    """A grouped convolution's backward (LPI's depthwise one: groups = channels) does the forward's
    products twice, for the input's gradient and the weight's; torch's own formula counts the
    weight's as one group, ``groups`` times over."""
    from deepvit_tools.benchmark.flops import WorkCounter
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    w = torch.randn(8, 8 // groups, 3, 3, requires_grad=True)
    with WorkCounter() as counter:
        torch.nn.functional.conv2d(x, w, padding=1, groups=groups).sum().backward()
    flops = {o.name: o.flops for o in counter.ops if o.name.startswith('convolution')}
    forward = 2 * 2 * 6 * 6 * 3 * 3 * 8 * (8 // groups)  # 2 FLOPs a multiply-add
    assert flops == {'convolution': forward, 'convolution_backward': 2 * forward}
