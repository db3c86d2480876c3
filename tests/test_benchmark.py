"""tools/benchmark.py: quick mode end to end, the timm comparison, the memory method, config
models and the mIoU of a checkpoint. Speed itself is measured by the tool, never asserted here."""
import csv
import importlib.util
import os
import shlex
import subprocess
import sys

import pytest
import torch

from deepvit_mm import benchmark as bm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location('benchmark_tool',
                                               os.path.join(ROOT, 'tools', 'benchmark.py'))
tool = importlib.util.module_from_spec(_spec)  # tools/benchmark.py, without touching sys.path
_spec.loader.exec_module(tool)

DEMO_SEG = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
DEMO_DET = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')


def test_quick_mode_writes_table_csv_plot_and_a_reproducing_command(tmp_path, capsys):
    out = tmp_path / 'bench'
    tool.main(['--quick', '--sizes', '64', '--out-dir', str(out)])
    printed = capsys.readouterr().out
    with open(out / 'benchmark.csv') as f:
        rows = list(csv.DictReader(f))
    assert [(r['label'], r['size'], r['dtype'], r['mode']) for r in rows] == [
        ('nano_12_p16', '64x64', d, m) for d in ('fp32', 'bf16') for m in ('fwd', 'train')]
    for r in rows:
        assert not r['error']
        assert float(r['latency_ms']) > 0 and float(r['throughput']) > 0 and float(r['cpu_ms']) > 0
        assert float(r['peak_mem_mib']) > 0  # activations at least
        assert r['repeats'] == '1'
    assert os.path.getsize(out / 'benchmark.png') > 1000
    md = (out / 'benchmark.md').read_text()
    assert md.count('| nano_12_p16 | 64x64 |') == 4 and 'load_avg' in md
    # the printed command spells out every setting and parses back to the same run
    (line,) = {ln for ln in printed.splitlines() if ln.startswith('reproduce with: ')}
    cmd = shlex.split(line[len('reproduce with: '):])
    assert cmd[:2] == ['python', 'tools/benchmark.py'] and '--quick' not in cmd
    again = tool.parse_args(cmd[2:])
    first = tool.parse_args(['--quick', '--sizes', '64', '--out-dir', str(out)])
    for key in ('arch', 'config', 'sizes', 'batch', 'dtypes', 'passes', 'warmup', 'repeats',
                'out_dir', 'compare_timm', 'compare_only', 'checkpoint'):
        assert getattr(again, key) == getattr(first, key), key
    assert f'Reproduce: `{line[len("reproduce with: "):]}`' in md


def test_compare_with_timm_same_outputs_and_ratios():
    # forced on: at this size 'auto' would run timm's own forward
    res = bm.compare_with_timm('nano_12_p16', (64, 96), warmup=0, repeats=1, memory=False,
                               modes=bm.COMPARE_MODES[:3], backbone_kwargs=dict(fast_forward=True))
    assert res['fast_forward'] is True
    assert 0 < res['max_rel_err'] < 1e-5  # the same function as timm's, computed differently
    assert res['bf16_max_rel_err'] < 2e-2
    assert 'train_bf16' not in res
    for key in ('fwd_fp32', 'fwd_bf16', 'train_fp32'):
        v = res[key]
        assert v['ours_ms'] > 0 and v['timm_ms'] > 0
        assert v['ratio'] == pytest.approx(v['ours_ms'] / v['timm_ms'])


def test_timm_baseline_shares_the_adapter_and_copies_the_trunk():
    from deepvit_mm import XCiT
    ours = XCiT('nano_12_p8')
    base = bm.TimmBaseline(ours)
    assert base.adapter is ours.adapter
    timm_sd = base.timm_model.state_dict()
    for k, v in ours.trunk.state_dict().items():
        assert torch.equal(timm_sd[k], v), k


@pytest.mark.skipif(not os.path.exists('/proc/self/statm'), reason='Linux /proc')
def test_cpu_peak_memory_sees_an_allocation():
    # The method is meant for a fresh process, as the benchmark runs every measurement: in a
    # long-lived one (this test session) memory freed by earlier tests can be reused without
    # raising the resident peak, so the check runs in a new interpreter.
    code = ('import sys, torch; sys.path.insert(0, sys.argv[1]); '
            'from deepvit_mm import benchmark as bm\n'
            'def run():\n'
            '    x = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB, freed when run() returns\n'
            '    x.add_(1)\n'
            "mib, method = bm._peak_memory(run, 'cpu')\n"
            "print(f'{mib}|{method}')")
    out = subprocess.run([sys.executable, '-c', code, ROOT], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    mib, method = out.stdout.strip().splitlines()[-1].split('|', 1)
    assert 48 < float(mib) < 160, (mib, method)
    assert method.startswith('VmHWM')


def test_parse_size_and_bad_cases():
    assert bm.parse_size('512') == (512, 512)
    assert bm.parse_size('800x1344') == (800, 1344)
    for bad in ('abc', '512x', '-3'):
        with pytest.raises(ValueError, match='HxW'):
            bm.parse_size(bad)
    with pytest.raises(ValueError, match='dtype'):
        bm.Case('nano_12_p16', (64, 64), dtype='fp16')
    with pytest.raises(ValueError, match='timm baseline'):
        bm.Case(DEMO_SEG, (64, 64), impl='timm')
    with pytest.raises(SystemExit):
        tool.parse_args(['--checkpoint', 'x.pth'])  # needs --config


def test_failures_come_back_as_rows():
    res = bm.measure_isolated(bm.Case('nano_12_p16', (8, 8), repeats=0))  # below one patch
    assert 'smaller than one 16x16 patch' in res['error']


@pytest.mark.parametrize('config,mode', [(DEMO_SEG, 'train'), (DEMO_DET, 'fwd')])
def test_config_models(config, mode):
    res = bm.measure(bm.Case(config, (64, 96), mode=mode, warmup=0, repeats=1), memory=False)
    assert res['latency_ms'] > 0 and res['label'] == os.path.basename(config)[:-3]


def test_miou_of_a_checkpoint(tmp_path):
    from mmengine.config import Config
    from mmengine.model.utils import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from deepvit_mm.datasets import make_ade_demo
    data = tmp_path / 'ade'
    make_ade_demo(str(data), num_train=1, num_val=2, size=128, seed=5)
    init_default_scope('mmseg')
    model = revert_sync_batchnorm(MODELS.build(Config.fromfile(DEMO_SEG).model))
    ckpt = tmp_path / 'model.pth'
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), ckpt)
    metrics = bm.evaluate_checkpoint(
        DEMO_SEG, str(ckpt), str(tmp_path / 'work'),
        {'test_dataloader.dataset.data_root': str(data), 'test_dataloader.num_workers': 0,
         'test_dataloader.persistent_workers': False})
    assert 0.0 <= metrics['mIoU'] <= 100.0 and 'aAcc' in metrics
    with pytest.raises(ValueError, match='needs an mmseg config'):
        bm.evaluate_checkpoint(DEMO_DET, str(ckpt), str(tmp_path / 'work2'))
