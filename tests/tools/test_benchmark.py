"""The measurement harness (deepvit_tools.benchmark) and the three tools that call it.

Speed is measured by the tools, never asserted here: the tests check what each number is made of
(which call was timed, what memory was counted, which rows a report gets)."""
import csv
import json
import math
import os
import shlex

import pytest
import torch
from conftest import ROOT, analysis_tool

from deepvit_mm.engine.optimizers.cpu_amp_optim_wrapper import cpu_float16_training_problem
from deepvit_tools import benchmark as bm

DEMO_SEG = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
DEMO_DET = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
SMALL_DET = {'model.backbone.arch': 'nano_12_p16'}  # the demo detector, cheaper
LINUX = os.path.exists('/proc/self/clear_refs')


# --------------------------------------------------------------------------------------------
# isolation and peak memory
# --------------------------------------------------------------------------------------------
def _allocate(mib: int):
    """In a fresh process: the peak memory of a call that touches ``mib`` MiB and frees them."""
    def run():
        if mib:
            torch.ones(mib * 2 ** 20 // 4).add_(1)
    return bm.memory.peak_memory(run, 'cpu')


def _fail(message):
    raise KeyError(message)


def _sleep(seconds):
    import time
    time.sleep(seconds)


@pytest.mark.skipif(not LINUX, reason='Linux /proc')
@pytest.mark.slow
def test_cpu_peak_memory_sees_a_known_allocation_and_nothing_else():
    """``run_isolated`` measures a known allocation's growth in a fresh process. ~10 s: the process."""
    growth, method, absolute = bm.isolation.run_isolated(_allocate, 200)
    assert 195 <= growth < 260, growth
    assert method == 'VmHWM - VmRSS (fresh process)'
    assert absolute['peak'] - absolute['before'] == pytest.approx(growth)
    idle, _, _ = bm.isolation.run_isolated(_allocate, 0)
    assert idle < 10, idle


def test_tensor_peak_counts_the_tensors_of_a_call():
    def run():
        a = torch.ones(16 * 2 ** 20 // 4)  # 16 MiB
        b = torch.ones(32 * 2 ** 20 // 4)  # + 32 MiB alive together
        del a, b
        torch.ones(8 * 2 ** 20 // 4)  # 8 MiB after both were freed: not a new peak
    assert bm.tensor_peak(run) == pytest.approx(48, abs=0.5)


@pytest.mark.slow
def test_isolated_failures_raise_with_the_reason():
    """A call that raises and one that times out in ``run_isolated`` raise with the reason. Two
    processes forked from the fork server (which the first test to need it starts, importing torch
    and deepvit_mm), one of them left to its 0.5 s time-out."""
    with pytest.raises(bm.isolation.IsolatedError, match="KeyError: 'no such thing'"):
        bm.isolation.run_isolated(_fail, 'no such thing')
    with pytest.raises(bm.isolation.IsolatedError, match='timed out after 0.5 s'):
        bm.isolation.run_isolated(_sleep, 60, timeout=0.5)


@pytest.mark.slow
def test_failures_come_back_as_rows():
    """A measurement that fails in its process comes back as a row with the error. A process forked
    from the fork server builds XCiT-N12/16, whose first call refuses the 8x8 input."""
    res = bm.measure_isolated(bm.Case('nano_12_p16', (8, 8), repeats=0))  # below one patch
    assert 'smaller than one 16x16 patch' in res['error'] and res['label'] == 'nano_12_p16'


# --------------------------------------------------------------------------------------------
# models and synthetic batches
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_backbones_are_built_by_family_through_the_registry():
    """Archs find their family, an unknown one is refused listing every family's names, and CaiT is
    built through the registry. Reads timm's model lists, builds CaiT-XXS24's first 4 blocks."""
    assert bm.models.backbone_family('xcit_nano_12_p16_224').__name__ == 'XCiT'
    assert bm.models.backbone_family('xxs24').__name__ == 'CaiT'
    cait = bm.models.build_backbone('xxs24', out_indices=(0, 1, 2, 3), window_size=2)
    assert (type(cait).__name__, len(cait.trunk.blocks), cait.window_size) == ('CaiT', 4, 2)
    with pytest.raises(ValueError, match='no backbone family knows arch'):
        bm.models.backbone_family('resnet50')


@pytest.mark.parametrize('config,cfg_options,size,padded', [
    (DEMO_SEG, None, (64, 80), (64, 80)),  # test-mode preprocessing: no padding to the crop
    (DEMO_DET, SMALL_DET, (64, 80), (64, 96)),  # mmdet pads to its size divisor (32)
])
@pytest.mark.slow
def test_synthetic_batch_goes_through_a_models_forward_and_loss(config, cfg_options, size,
                                                                padded):
    """The harness's synthetic batch goes through a model's loss, backward and tensor forward.
    Builds the demo segmentor or detector (XCiT-N12/16) and runs them on 2 images of 64x80."""
    from mmengine.registry import DefaultScope
    def scope():  # mmengine restores a scope as a copy: compare names, not objects
        return getattr(DefaultScope.get_current_instance(), 'scope_name', None)
    before = scope()
    model, task = bm.build_from_config(config, cfg_options)
    assert scope() == before  # built without changing the scope
    inputs, samples = bm.batches.synthetic_batch(model, task, size, batch=2)
    assert inputs.shape == (2, 3, *padded) and inputs.dtype == torch.float32
    assert len(samples) == 2 and samples[0].metainfo['img_shape'] == size
    model.train()
    total, log_vars = model.parse_losses(model(inputs, samples, mode='loss'))
    assert torch.isfinite(total) and len(log_vars) > 2  # several heads' losses
    total.backward()
    model.eval()
    with torch.no_grad():
        out = model(inputs, samples, mode='tensor')
    assert out is not None


def test_backbone_input_is_reproducible():
    a, b = bm.batches.backbone_input((32, 48), 2, seed=3), bm.batches.backbone_input((32, 48), 2, seed=3)
    assert a.shape == (2, 3, 32, 48) and torch.equal(a, b)
    assert not torch.equal(a, bm.batches.backbone_input((32, 48), 2, seed=4))


# --------------------------------------------------------------------------------------------
# one measurement
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_measure_times_the_first_call_when_no_warmup_and_restores_threads():
    """Without warm-up the first (memory-measuring) call is timed; threads are restored. Builds
    XCiT-N12/16 twice in this process: 2 training passes at 64x64, then 3 forwards."""
    threads = torch.get_num_threads()
    res = bm.measure(bm.Case('nano_12_p16', (64, 64), mode='train', threads=1, warmup=0,
                             repeats=2))
    assert torch.get_num_threads() == threads
    assert res['threads'] == 1
    assert len(res['latencies_ms']) == 2 and res['latencies_ms'][0] == res['first_call_ms']
    assert res['latency_ms'] == pytest.approx(sum(res['latencies_ms']) / 2)
    assert res['throughput'] == pytest.approx(1e3 / res['latency_ms'])
    assert res['info']['blocks'] == 12 and res['info']['tokens'] == 16  # 64 / 16 = 4 a side
    warm = bm.measure(bm.Case('nano_12_p16', (64, 64), warmup=2, repeats=1), memory=False)
    assert len(warm['latencies_ms']) == 1 and warm['first_call_ms'] is None


@pytest.mark.parametrize('config,mode', [(DEMO_SEG, 'train'), (DEMO_DET, 'fwd')])
@pytest.mark.slow
def test_config_models(config, mode):
    """A config is measured as its whole model: label, task, one timed call. Builds the demo
    segmentor (a training pass) or detector (XCiT-N12/16, a forward) at 64x96 in this process."""
    res = bm.measure(bm.Case(config, (64, 96), mode=mode, warmup=0, repeats=1,
                             cfg_options=SMALL_DET if config == DEMO_DET else {}),
                     memory=False)
    assert res['label'] == os.path.basename(config)[:-3]
    assert res['info']['task'] == ('seg' if config == DEMO_SEG else 'det')
    assert len(res['latencies_ms']) == 1 and res['peak_mem_mib'] is None


@pytest.mark.slow
def test_step_pass_runs_the_configs_optimizer(monkeypatch):
    """``step`` times ``model.train_step``: each call is one optimizer update, and its memory is
    the growth over the built model, optimizer and batch. Builds the demo detector (XCiT-N12/16)
    in this process: 2 steps at 64x96."""
    from mmengine.optim import OptimWrapper
    updates, update = [], OptimWrapper.update_params
    monkeypatch.setattr(OptimWrapper, 'update_params',
                        lambda self, loss, **kw: updates.append(float(loss)) or update(self, loss,
                                                                                      **kw))
    res = bm.measure(bm.Case(DEMO_DET, (64, 96), mode='step', warmup=0, repeats=2,
                             cfg_options=SMALL_DET))
    assert len(updates) == 2 and all(math.isfinite(v) for v in updates)
    assert len(res['latencies_ms']) == 2 and res['info']['task'] == 'det'
    assert res['peak_mem_mib'] == pytest.approx(res['mem_peak_mib'] - res['mem_before_mib'])


def test_parse_size_and_bad_cases():
    assert bm.parse_size('512') == (512, 512)
    assert bm.parse_size('800x1344') == (800, 1344)
    for bad in ('abc', '512x', '-3'):
        with pytest.raises(ValueError, match='HxW'):
            bm.parse_size(bad)
    with pytest.raises(ValueError, match='dtype'):
        bm.Case('nano_12_p16', (64, 64), dtype='fp8')
    with pytest.raises(ValueError, match='baseline exists for backbone archs'):
        bm.Case(DEMO_SEG, (64, 64), impl='timm')
    with pytest.raises(ValueError, match='impl'):
        bm.Case('nano_12_p16', (64, 64), impl='torch')
    for model, dtype in (('nano_12_p16', 'fp32'), (DEMO_SEG, 'bf16')):
        with pytest.raises(ValueError, match="pass 'step' is a config's model.train_step"):
            bm.Case(model, (64, 64), dtype=dtype, mode='step')


# --------------------------------------------------------------------------------------------
# baselines and the interleaved comparison
# --------------------------------------------------------------------------------------------
def test_timm_baseline_shares_the_adapter_and_copies_the_trunk():
    ours = bm.models.build_backbone('nano_12_p8')
    base = bm.baselines.TimmBaseline(ours, (64, 64))
    assert base.adapter is ours.adapter
    timm_sd = base.timm_model.state_dict()
    for k, v in ours.trunk.state_dict().items():
        assert torch.equal(timm_sd[k], v), k


@pytest.mark.parametrize('arch', ['nano_12_p16', 'xxs24'])
def test_timm_baseline_rescales_the_simple_pyramids_one_tap_to_every_level(arch):
    ours = bm.models.build_backbone(arch, out_indices=(0,), pyramid='simple').eval()
    base = bm.baselines.TimmBaseline(ours, (64, 64)).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        want, got = ours(x), base(x)
    assert [o.shape[-1] for o in got] == [16, 8, 4, 2]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(want, got))


def test_cait_timm_baseline_runs_at_the_input_grid_with_our_embedding():
    ours = bm.models.build_backbone('xxs24', out_indices=(0, 1, 2, 3)).eval()
    base = bm.baselines.TimmBaseline(ours, (64, 80)).eval()  # padded to 64x96: a 4x6 grid, not 14x14
    assert base.timm_model.pos_embed.shape == (1, 24, 192)
    with torch.no_grad():
        assert torch.equal(base.timm_model.pos_embed, ours.pos_embed_for((4, 6)))
    with pytest.raises(ValueError, match='global attention only'):
        bm.baselines.TimmBaseline(bm.models.build_backbone('xxs24', out_indices=(0, 1, 2, 3), window_size=2),
                        (64, 64))


@pytest.mark.parametrize('arch,kwargs,err', [
    # forced on: at this size 'auto' would run timm's own forward; the same function computed
    # differently, so equal to float rounding and not bit for bit
    ('nano_12_p16', dict(gram_xca=True), (1e-9, 1e-5)),
    ('xxs24', dict(out_indices=(0, 1, 2, 3)), (0, 1e-5)),
    # stochastic depth: the training passes move the trunks' BatchNorm statistics by their own
    # random draws, differently in ours and timm's; the outputs are compared before them
    ('nano_12_p8', dict(drop_path_rate=0.3, out_indices=(1, 3, 5, 7)), (0, 1e-5)),
])
@pytest.mark.slow
def test_compare_same_outputs_and_ratios(arch, kwargs, err):
    """``compare`` gives the same outputs for ours and timm's and consistent ratios. ~2-6 s: each
    mode measured."""
    fp16 = cpu_float16_training_problem() is None  # torch 2.1: no float16 CPU autocast
    modes = (('fwd', 'fp32'), ('fwd', 'bf16'), ('train', 'fp32')) + ((('fwd', 'fp16'),) if fp16 else ())
    res = bm.compare(arch, (64, 96), warmup=0, repeats=1, memory=False,
                     modes=modes, backbone_kwargs=kwargs, baselines=('timm', 'floor'))
    assert err[0] <= res['max_rel_err'] < err[1]
    assert res['bf16_max_rel_err'] < 2e-2 and (not fp16 or res['fp16_max_rel_err'] < 2e-3)
    assert 'train_bf16' not in res and 'floor_max_rel_err' not in res  # the floor is not a model
    for key in (f'{m}_{d}' for m, d in modes):
        v = res[key]
        assert v['ratio'] == pytest.approx(v['ours_ms'] / v['timm_ms'])
        assert v['ratio_floor'] == pytest.approx(v['ours_ms'] / v['floor_ms'])


# --------------------------------------------------------------------------------------------
# reports
# --------------------------------------------------------------------------------------------
def _row(mode, latency, peak, **kw):
    return dict(label='m', model='m', size=(64, 96), batch=1, dtype='fp32', mode=mode,
                impl='ours', device='cpu', threads=1, warmup=1, repeats=3, latency_ms=latency,
                latency_min_ms=latency - 1, throughput=1e3 / latency, cpu_ms=latency,
                peak_mem_mib=peak, mem_before_mib=100.0, mem_peak_mib=100.0 + peak,
                mem_method='VmHWM - VmRSS (fresh process)',
                first_call_ms=2 * latency, **kw)


def test_write_report_rows_tables_and_files(tmp_path):
    rows = [_row('fwd', 10.0, 20.0), _row('train', 30.0, 50.0),
            dict(label='m', model='m', size=(128, 128), batch=1, dtype='bf16', mode='fwd',
                 error='killed')]
    cmp = [dict(label='a', size=(64, 64), batch=1, baselines=['timm', 'floor'],
                max_rel_err=1e-7, fwd_fp32=dict(ours_ms=8.0, timm_ms=10.0, floor_ms=2.0,
                                                ratio=0.8, ratio_floor=4.0, ours_mem_mib=5.0,
                                                timm_mem_mib=6.0))]
    paths = bm.write_report(str(tmp_path), rows, cmp, 'python x', {'k': 'v'})
    with open(paths['csv']) as f:
        got = list(csv.DictReader(f))
    assert [(r['size'], r['mode'], r['latency_ms'], r['peak_mem_mib'], r['error']) for r in got] \
        == [('64x96', 'fwd', '10.0', '20.0', ''), ('64x96', 'train', '30.0', '50.0', ''),
            ('128x128', 'fwd', '', '', 'killed')]
    with open(paths['compare_csv']) as f:
        (c,) = list(csv.DictReader(f))
    assert list(c)[:7] == ['label', 'size', 'batch', 'pass', 'ours_ms', 'timm_ms', 'ratio']
    assert (c['pass'], c['ratio'], c['floor_ms'], c['ratio_floor'], c['max_rel_err']) == \
        ('fwd_fp32', '0.8', '2.0', '4.0', '1e-07')
    md = open(paths['md']).read().splitlines()
    # the markdown tables hold the CSV files' columns and rows
    assert '| ' + ' | '.join(bm.report.ROW_FIELDS) + ' |' in md
    assert '| m | 64x96 | 1 | fp32 | train | ours | cpu | 1 | 1 | 3 | 30.00 | - | 29.00 | 33.33 | ' \
        '30.00 | 50.00 | 100.00 | 150.00 | - | VmHWM - VmRSS (fresh process) | 60.00 | - |' in md
    assert '| m | 128x128 | 1 | bf16 | fwd |' + ' - |' * 16 + ' killed |' in md
    assert '| ' + ' | '.join(c) + ' |' in md
    assert '| a | 64x64 | 1 | fwd_fp32 | 8.00 | 10.00 | 0.80 | 2.00 | 4.00 | 5.00 | 6.00 | ' \
        '1.00e-07 |' in md
    assert 'Reproduce: `python x`' in md
    assert os.path.getsize(paths['png']) > 1000


def test_comparison_rows_flatten_each_mode_with_the_errors_and_rates():
    """A comparison with two modes, compiled models and the roofline: one row per mode with that
    mode's figures (not the other's), every output error and the device rates."""
    cmp = dict(label='a', size=(64, 64), batch=2, baselines=['timm'], compiled=True,
               rates=dict(fp32_tflops=50.0, copy_tbs=2.5), max_rel_err=1e-7,
               ours_compiled_max_rel_err=2e-7, measurements=[],
               fwd_fp32=dict(ours_ms=30.0, timm_ms=40.0, ratio=0.75, ours_compiled_ms=15.0,
                             ours_compiled_vs_eager=0.5, ours_roofline_ms=10.0),
               train_fp32=dict(ours_ms=90.0, timm_ms=80.0, ratio=1.125))
    fwd, train = bm.report.comparison_rows([cmp])
    assert fwd == dict(label='a', size='64x64', batch=2, **{'pass': 'fwd_fp32'}, ours_ms=30.0,
                       timm_ms=40.0, ratio=0.75, ours_compiled_ms=15.0,
                       ours_compiled_vs_eager=0.5, ours_roofline_ms=10.0, max_rel_err=1e-7,
                       ours_compiled_max_rel_err=2e-7, rate_fp32_tflops=50.0, rate_copy_tbs=2.5)
    assert train['pass'] == 'train_fp32' and train['ratio'] == 1.125
    assert 'ours_compiled_ms' not in train and train['rate_copy_tbs'] == 2.5


def test_timings_interleave_in_rotating_order_with_exact_counts_and_threads():
    """Warm-up calls first, then one timed call of each run per round, the first one rotating;
    every call counted (no hidden warm-up), torch's threads set inside and restored after."""
    calls, threads = [], torch.get_num_threads()
    runs = {k: (lambda k=k: calls.append((k, torch.get_num_threads()))) for k in 'abc'}
    res = bm.timings(runs, warmup=1, repeats=3, threads=1, label='L', sub_label='S')
    assert [k for k, _ in calls] == list('abc' 'abc' 'bca' 'cab')
    assert {n for _, n in calls} == {1} and torch.get_num_threads() == threads
    for k, m in res.items():
        assert len(m.times) == 3 and len(m.metadata['cpu_times']) == 3
        assert (m.task_spec.description, m.task_spec.label, m.task_spec.sub_label,
                m.task_spec.num_threads) == (k, 'L', 'S', 1)
    assert len(calls) == 12


@pytest.mark.slow
def test_compare_compiled_against_eager_and_the_roofline():
    """``compare(compile=True)``: ours and timm's nano compiled by inductor against eager and the
    roofline, on one block (the simple pyramid: every level from one tap, which the timm baseline
    rescales as ours does; the paper pyramid's four taps need four blocks, ~30 % more compiling).
    ~40-90 s: two inductor compilations on the CPU."""
    import torch._dynamo.config as cfg
    limit = 'recompile_limit' if hasattr(cfg, 'recompile_limit') else 'cache_size_limit'
    before = getattr(cfg, limit)
    res = bm.compare('nano_12_p16', (32, 32), warmup=0, repeats=1, memory=False,
                     modes=(('fwd', 'fp32'),),
                     backbone_kwargs=dict(out_indices=(0,), pyramid='simple'),
                     compile=True, roofline=True)
    v = res['fwd_fp32']
    assert res['max_rel_err'] == 0.0  # timm's eager model computes what ours does
    assert res['ours_compiled_max_rel_err'] < 1e-5 and res['timm_compiled_max_rel_err'] < 1e-5
    for impl in ('ours', 'timm'):
        assert v[f'{impl}_compiled_vs_eager'] == pytest.approx(
            v[f'{impl}_compiled_ms'] / v[f'{impl}_ms'])
        assert v[f'{impl}_compiled_vs_roofline'] == pytest.approx(
            v[f'{impl}_compiled_ms'] / v[f'{impl}_roofline_ms'])
        assert v[f'{impl}_compiled_first_ms'] > v[f'{impl}_compiled_ms']  # it compiled then
        assert v[f'{impl}_gflop'] > 0 and v[f'{impl}_roofline_ms'] >= v[f'{impl}_compute_ms']
    assert res['rates']['fp32_tflops'] > 0 and getattr(cfg, limit) == before


def test_write_report_without_measurements_writes_no_csv(tmp_path):
    paths = bm.write_report(str(tmp_path), [], [], 'python x', {})
    assert set(paths) == {'md'} and sorted(os.listdir(tmp_path)) == ['benchmark.md']


# --------------------------------------------------------------------------------------------
# the tools, end to end on tiny settings
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_benchmark_tool_quick_mode_and_a_reproducing_command(tmp_path, capsys):
    """tools/analysis/benchmark.py --quick writes its report and the command that reproduces it.
    ~5-10 s: the measurements."""
    tool = analysis_tool('benchmark')
    out = tmp_path / 'bench'
    argv = ['--quick', '--sizes', '64', '--dtypes', 'fp32', '--profile', '--tensor-peak',
            '--mem-limit-gb', '16', '--out-dir', str(out)]
    tool.main(argv)
    printed = capsys.readouterr().out
    with open(out / 'benchmark.csv') as f:
        rows = list(csv.DictReader(f))
    assert [(r['label'], r['size'], r['dtype'], r['mode'], r['repeats'], r['error'])
            for r in rows] == [('nano_12_p16', '64x64', 'fp32', m, '1', '') for m in
                               ('fwd', 'train')]
    for r in rows:  # --quick: no warm-up, one repeat: the timed call is the first call
        assert r['latency_ms'] == r['first_call_ms'] == r['latency_min_ms']
        assert r['mem_method'].startswith('VmHWM' if LINUX else 'ru_maxrss')
        assert float(r['peak_mem_mib']) == pytest.approx(
            float(r['mem_peak_mib']) - float(r['mem_before_mib']), abs=0.01)
        assert 0 < float(r['tensor_peak_mib'])  # --tensor-peak: the profiled first call
    md = (out / 'benchmark.md').read_text()
    assert md.count('| nano_12_p16 | 64x64 |') == 2 and 'load_avg' in md
    # --profile: each pass's operator table in the report and its Chrome trace beside it
    assert md.count('### Operators by self time: nano_12_p16, 64x64, fp32') == 2
    assert md.count('Self CPU time total') == 2 and 'aten::addmm' in md
    traces = sorted(os.listdir(out / 'profiles'))
    assert traces == ['nano_12_p16_64x64_fp32_fwd.json', 'nano_12_p16_64x64_fp32_train.json']
    with open(out / 'profiles' / traces[1]) as f:
        names = {e.get('name') for e in json.load(f)['traceEvents']}
    assert {'aten::addmm', 'autograd::engine::evaluate_function: AddmmBackward0'} <= names
    # the printed command spells out every setting and parses back to the same run
    (line,) = {ln for ln in printed.splitlines() if ln.startswith('reproduce with: ')}
    cmd = shlex.split(line[len('reproduce with: '):])
    assert cmd[:2] == ['python', 'tools/analysis/benchmark.py'] and '--quick' not in cmd
    again, first = tool.parse_args(cmd[2:]), tool.parse_args(argv)
    for key in ('arch', 'config', 'sizes', 'batch', 'dtypes', 'passes', 'warmup', 'repeats',
                'out_dir', 'compare_timm', 'compare_floor', 'compare_only',
                'profile', 'tensor_peak', 'mem_limit_gb'):
        assert getattr(again, key) == getattr(first, key), key
    assert f'Reproduce: `{line[len("reproduce with: "):]}`' in md


@pytest.mark.slow
def test_benchmark_tool_compare_only_for_cait(tmp_path):
    """tools/analysis/benchmark.py --compare-only on CaiT-XXS24 (4 blocks) at 64x64: only
    compare.csv. Ours, timm's and the floor timed, ours' and timm's memory each measured in a fresh
    process."""
    tool = analysis_tool('benchmark')
    tool.main(['--arch', 'xxs24', '--sizes', '64', '--dtypes', 'fp32', '--passes', 'fwd',
               '--warmup', '0', '--repeats', '1', '--compare-timm', '--compare-floor',
               '--compare-only', '--cfg-options', 'out_indices=(0,1,2,3)',
               '--out-dir', str(tmp_path)])
    assert not (tmp_path / 'benchmark.csv').exists()  # --compare-only: no per-model table
    with open(tmp_path / 'compare.csv') as f:
        (row,) = list(csv.DictReader(f))
    assert (row['label'], row['pass']) == ('xxs24', 'fwd_fp32')
    assert float(row['max_rel_err']) < 1e-5
    assert float(row['ratio_floor']) == pytest.approx(float(row['ours_ms']) / float(row['floor_ms']))
    assert float(row['ours_mem_mib']) > 0 and float(row['timm_mem_mib']) > 0  # measured, isolated


def test_benchmark_tool_option_errors():
    tool = analysis_tool('benchmark')
    for argv in (['--compare-only'], ['--compare-floor'],
                 ['--compile'], ['--roofline'],
                 ['--config', DEMO_SEG, '--compare-timm'],
                 ['--arch', 'n12', '--compare-timm', '--compare-only', '--profile'],
                 ['--passes', 'step'], ['--config', DEMO_SEG, '--passes', 'step', '--dtypes', 'bf16']):
        with pytest.raises(SystemExit):
            tool.parse_args(argv)
