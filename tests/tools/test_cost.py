"""What the harness counts: the GEMM floor, each operator's FLOPs and bytes (the roofline), a
pass's work by kind (the breakdown) and a training step's parts with their floors."""
import os

import pytest
import torch
from conftest import ROOT, analysis_tool

from deepvit_tools import benchmark as bm

DEMO_SEG = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
DEMO_DET = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
SMALL_DET = {'model.backbone.arch': 'nano_12_p16'}  # the demo detector, cheaper


def test_gemm_floor_has_the_block_gemms_of_the_model():
    ours = bm.build_backbone('nano_12_p16', out_indices=(1, 3, 5, 7))  # 8 blocks, C = 128
    floor = bm.GemmFloor(ours, (64, 80), batch=2)  # padded 64x96: 4x6 = 24 tokens per image
    assert floor.tokens == 48 and floor.blocks == 8
    assert floor.multiply_adds == 8 * 12 * 48 * 128 ** 2
    acc, last = floor(bm.backbone_input((64, 80), 2))
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
    ours = bm.build_backbone('xxs24', **kwargs)
    floor = bm.GemmFloor(ours, (64, 96), batch=2)
    assert floor.spans == spans
    assert floor.multiply_adds == 4 * 12 * 48 * 192 ** 2 + sum(2 * g * n * n * d
                                                                for g, n, d in spans)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        floor(bm.backbone_input((64, 96), 2))
    ops = {e.key: e.count for e in prof.key_averages()}
    assert ops['aten::bmm'] == 2 * 4 and ops['aten::mm'] == 4 * 4


def test_pass_cost_counts_the_products_and_bytes_of_each_operator():
    m, k, n = 64, 32, 16
    lin, x = torch.nn.Linear(k, n), torch.randn(m, k)
    fwd = bm.pass_cost(lambda: lin(x))
    # addmm(bias, x, weight.t()): 2mkn FLOPs; reads bias, x and the weight, writes the output
    assert fwd['flops'] == 2 * m * k * n
    assert fwd['bytes'] == 4 * (n + m * k + k * n + m * n)
    assert [op[0] for op in fwd['ops']] == ['addmm']  # the transposing view moves nothing
    xg = x.clone().requires_grad_()
    train = bm.pass_cost(lambda: lin(xg).sum().backward())
    assert train['flops'] == 3 * fwd['flops']  # the backward's two products are counted
    assert {op[3] for op in train['ops'] if op[1]} == {torch.float32}
    # in place (XCiT's fast path): no formula in FlopCounterMode, counted all the same
    out, w = torch.zeros(m, n), torch.randn(k, n)
    inplace = bm.pass_cost(lambda: out.addmm_(x, w))
    assert inplace['flops'] == 2 * m * k * n
    assert inplace['ops'][0].elements == m * n


def test_roofline_sums_each_operator_at_its_limit():
    from deepvit_tools.benchmark.flops import Op
    ops = [Op('mm', 2e12, 1e9, torch.bfloat16, 0), Op('add', 0, 3e9, torch.float32, 0),
           Op('mm', 1e12, 1e9, torch.float16, 0)]  # no float16 rate measured: the fastest one
    cost = dict(ops=ops, flops=3e12, bytes=5e9)
    r = bm.roofline(cost, {torch.bfloat16: 1e12, torch.float32: 0.5e12, 'copy': 1e12})
    assert r['roofline_ms'] == pytest.approx((2 + 3e-3 + 1) * 1e3)
    assert r['compute_ms'] == pytest.approx(3e3) and r['memory_ms'] == pytest.approx(5.0)
    assert (r['gflop'], r['gbyte']) == (3e3, 5.0)
    rates = bm.device_rates('cpu', (torch.float32,), n=128, repeats=1)
    assert rates.keys() == {torch.float32, 'copy'} and min(rates.values()) > 0
    rates = bm.device_rates('cpu', (torch.float32, torch.bfloat16), gemm=(96, 64, 256),
                            stream=4096, repeats=1, gelu=True)
    assert rates.keys() == {torch.float32, torch.bfloat16, 'copy', 'gelu'}
    assert min(rates.values()) > 0
    rates = bm.device_rates('cpu', mlp=(96, 64), repeats=1)  # (96, 64) x (64, 256), 96 x 256
    assert rates.keys() == {torch.float32, 'copy'} and min(rates.values()) > 0


@pytest.mark.parametrize('config,cfg_options,parts', [
    (DEMO_DET, SMALL_DET, ['data', 'backbone', 'neck', 'rpn', 'roi']),
    (DEMO_SEG, None, ['data', 'backbone', 'neck', 'decode']),
])
@pytest.mark.slow
def test_split_step_leaves_the_gradients_of_a_whole_step(config, cfg_options, parts):
    """Timing the parts apart must not change what the step computes: every parameter's gradient
    equals that of the whole model's loss backward on the same batch and RNG state."""
    from deepvit_tools.benchmark.step import split_backward
    opts = dict(cfg_options or {}, **{'model.backbone.drop_path_rate': 0.0})
    model, task = bm.build_from_config(config, opts)
    model.train()
    from deepvit_mm.apis import num_classes_of
    data = bm.synthetic_data(task, (64, 96), 2, num_classes_of(model, task), 3)
    torch.manual_seed(1)
    times = split_backward(model, data, task)
    split = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    batch = model.data_preprocessor(data, True)
    total, _ = model.parse_losses(model(**batch, mode='loss'))
    total.backward()
    whole = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(times) == {('data', '')} | {(p, ph) for p in parts[1:] for ph in ('fwd', 'bwd')}
    assert split.keys() == whole.keys() and any(n.startswith('backbone.') for n in whole)
    for n in whole:
        torch.testing.assert_close(split[n], whole[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize('dtype', ['fp32', 'bf16'])
@pytest.mark.slow
def test_profile_train_step_tool(capsys, dtype):
    """tools/analysis/profile_train_step.py on the demo detector: its table and rows. ~5-10 s: a
    profiled training step."""
    tool = analysis_tool('profile_train_step')
    import sys
    argv = sys.argv
    sys.argv = ['profile_train_step.py', DEMO_DET, '--shape', '64', '96', '--batch-size', '2',
                '--num-objects', '2', '--steps', '1', '--warmup', '0', '--dtype', dtype,
                '--cfg-options', 'model.backbone.arch=nano_12_p16']
    try:
        tool.main()
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    rows = {ln.split('|')[1].strip(): ln for ln in out.splitlines() if ln.startswith('| ')}
    assert {'data', 'backbone', 'neck', 'rpn', 'roi', 'optimizer', 'sum of the parts',
            '`model.train_step`, same run'} <= rows.keys()
    shares = [float(ln.split('|')[5].strip(' %')) for k, ln in rows.items()
              if k not in ('part', 'sum of the parts', '`model.train_step`, same run')]
    assert abs(sum(shares) - 100) <= len(shares)  # rounded shares of the sum
    floors = {k: float(ln.split('|')[6]) for k, ln in rows.items()
              if k in ('backbone', 'neck', 'rpn', 'roi', 'optimizer', 'sum of the parts')}
    assert all(v > 0 for v in floors.values()), floors
    assert 'GFLOP/s (float32 GEMM' in out and f', {dtype}, ' in out


@pytest.mark.slow
def test_op_breakdown_counts_the_block_products_and_sums_to_the_pass():
    """timm's XCiT forward (gram_xca=False) does the standard block GEMMs, XCA's per-head
    products and the adapter's transposed convs (GEMMs on CPU): the profiler's count must be
    exactly that; the kinds' seconds add up to the measured pass."""
    res = bm.op_breakdown('nano_12_p16', (64, 96), 'fwd', 1, gram_xca=False,
                          out_indices=(1, 3, 5, 7))
    floor = bm.GemmFloor(bm.build_backbone('nano_12_p16', out_indices=(1, 3, 5, 7)), (64, 96))
    n, c, d = 24, 128, 32  # tokens, channels, head dim (4 heads)
    adapter = n * c * 4 * c * (1 + 4 + 1)  # 2x2 transposed convs run as GEMMs: 2 to stride 4, 1
    xca = 8 * 2 * n * c * d  # q k^T and attn v per block, over tokens
    assert res['kinds']['matrix products']['macs'] == floor.multiply_adds + adapter + xca
    assert res['floor_macs'] == floor.multiply_adds
    assert res['floor_s'] == pytest.approx(floor.multiply_adds / res['gemm_rate'])
    # the kinds' work is the one count of the pass: the roofline's multiply-adds and bytes
    torch.manual_seed(0)
    model = bm.build_backbone('nano_12_p16', gram_xca=False, out_indices=(1, 3, 5, 7)).eval()
    x = bm.backbone_input((64, 96), 1)
    with torch.no_grad():
        model(x)  # a first call caches what later ones reuse (position encodings)
        cost = bm.pass_cost(lambda: model(x))
    assert sum(k['macs'] for k in res['kinds'].values()) == cost['flops'] // 2
    assert sum(k['bytes'] for k in res['kinds'].values()) == cost['bytes'] > 0
    norm = res['kinds']['normalisation']
    assert norm['floor_s'] == pytest.approx(norm['bytes'] / res['stream_rate'])
    assert sum(k['seconds'] for k in res['kinds'].values()) == pytest.approx(res['total_s'])
    assert {'matrix products', 'convolutions', 'GELU', 'normalisation'} <= res['kinds'].keys()
    assert res['kinds']['GELU']['elements'] >= 8 * 24 * 4 * 128  # the MLPs' hidden maps
    conv = res['kinds']['convolutions']
    assert conv['macs'] > 0 and conv['floor_s'] == pytest.approx(conv['macs'] / res['gemm_rate'])
    assert res['kinds_floor_s'] == pytest.approx(sum(k['floor_s'] for k in res['kinds'].values()))
    lines = bm.breakdown_markdown(res)
    assert lines[0].startswith('| work |')
    assert [ln.split('|')[7].split()[:2] for ln in lines if '**all**' in ln] == \
        [['block', 'GEMMs'], ['sum', 'of']]


@pytest.mark.slow
def test_step_floors_count_every_product_of_each_part():
    """The floors' multiply-adds per part are every matrix product and convolution of that part,
    forward and backward: the backbone's equal torch's FlopCounterMode over the backbone alone
    (its formulas; a grouped convolution's backward counted per group, as
    test_convolution_backward_counts_the_products_of_its_groups checks)."""
    from torch.utils.flop_counter import FlopCounterMode

    from deepvit_mm.apis import num_classes_of
    from deepvit_tools.benchmark.flops import _conv_backward
    from deepvit_tools.benchmark.step import _WorkClock, split_backward
    model, task = bm.build_from_config(DEMO_DET, {'model.backbone.arch': 'nano_12_p16',
                                                  'model.backbone.drop_path_rate': 0.0})
    model.train()
    data = bm.synthetic_data(task, (64, 96), 2, num_classes_of(model, task), 2)
    clock = _WorkClock()
    split_backward(model, data, task, clock)
    inputs = model.data_preprocessor(data, True)['inputs']
    with FlopCounterMode(display=False) as fwd:
        feats = model.backbone(inputs)
    with FlopCounterMode(display=False, custom_mapping={
            torch.ops.aten.convolution_backward: _conv_backward}) as bwd:
        torch.autograd.backward(feats, [torch.ones_like(f) for f in feats])
    assert clock.work[('backbone', 'fwd')]['macs'] == fwd.get_total_flops() // 2 > 0
    assert clock.work[('backbone', 'bwd')]['macs'] == bwd.get_total_flops() // 2 > 0
    assert all(w['bytes'] > 0 for w in clock.work.values())
    assert {p for p, _ in clock.work} == {'data', 'backbone', 'neck', 'rpn', 'roi'}


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
