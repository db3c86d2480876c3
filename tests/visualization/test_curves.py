"""Training curves (deepvit_mm.visualization.curves, tools/analysis/plot_curves.py) from
mmengine's scalars.json, and mmdet's and mmseg's own analyze_logs.py (run by ``mim run``, as
their users do) drawing our runs' logs."""
import functools
import importlib.util
import json
import os
import subprocess
import sys

import cv2
import pytest
from conftest import DEMO_DET, ROOT

from deepvit_mm.visualization import find_scalars, plot_curves, read_scalars

TOOL = os.path.join(ROOT, 'tools', 'analysis', 'plot_curves.py')
ENV = dict(os.environ, PYTHONWARNINGS='ignore', OMP_NUM_THREADS='2')


def _log(run, rows) -> str:
    """``rows`` written by mmengine's LocalVisBackend as LoggerHook writes them, ``(scalars,
    step)`` each, into ``run/vis_data/scalars.json`` (a run's folder, as the Runner makes it)."""
    from mmengine.visualization import LocalVisBackend
    backend = LocalVisBackend(os.path.join(str(run), 'vis_data'))
    for scalars, step in rows:
        backend.add_scalars(scalars, step=step)
    return os.path.join(str(run), 'vis_data', 'scalars.json')


def _train(i, loss):
    return dict(lr=0.1, loss=loss, loss_cls=loss / 2, time=0.5, data_time=0.1, iter=i, memory=9)


VAL = {'coco/bbox_mAP': 0.25, 'coco/bbox_mAP_50': 0.5, 'coco/segm_mAP': 0.2, 'time': 0.3}


@pytest.mark.parametrize('layout', ['iter', 'iter_by_iter', 'epoch'])
def test_validation_lines_are_placed_at_their_iteration(tmp_path, layout):
    """A validation line's step is 0 all through an iteration-based run (LoggerHook's default
    log_metric_by_epoch=True), the iteration with log_metric_by_epoch=False, the epoch in an
    epoch-based run: each is drawn at the iteration it followed."""
    val_step = {'iter': lambda i, e: 0, 'iter_by_iter': lambda i, e: i,
                'epoch': lambda i, e: e}[layout]
    rows = []
    for e, i in enumerate((10, 20), 1):
        rows += [(_train(i - 5, 2.0 / i), i - 5), (_train(i, 1.0 / i), i)]
        rows.append((VAL, val_step(i, e)))
    s = read_scalars(_log(tmp_path, rows))
    assert s.losses == ['loss', 'loss_cls']
    assert s.train['loss'] == ([5.0, 10.0, 15.0, 20.0], [2 / 10, 1 / 10, 2 / 20, 1 / 20])
    assert s.val['coco/bbox_mAP'] == ([10.0, 20.0], [0.25, 0.25])
    assert 'time' not in s.val and 'lr' not in s.train  # bookkeeping, not a curve
    out = plot_curves(s, str(tmp_path / 'c.png'))
    assert cv2.imread(out).shape == (360, 1000, 3)


def test_unknown_keys_are_refused_and_nothing_is_written(tmp_path):
    s = read_scalars(_log(tmp_path, [(_train(1, 1.0), 1), (VAL, 0)]))
    with pytest.raises(ValueError, match='has no validation key mIoU: it has coco/bbox_mAP, '
                                         'coco/bbox_mAP_50, coco/segm_mAP'):
        plot_curves(s, str(tmp_path / 'out' / 'c.png'), metrics=['mIoU'])
    with pytest.raises(ValueError, match='has no training key loss_x'):
        plot_curves(s, str(tmp_path / 'out' / 'c.png'), losses=['loss_x'])
    assert not (tmp_path / 'out').exists()
    bad = tmp_path / 'bad.json'
    bad.write_text('{"loss": 1}\n')
    with pytest.raises(ValueError, match='bad.json:1: not a line of mmengine'):
        read_scalars(str(bad))


@pytest.fixture
def tool(in_process):
    return functools.partial(in_process, TOOL)


def test_tool_finds_the_training_run_and_answers_in_one_line(tmp_path, tool):
    """A work dir: its newest run with losses (an evaluation's run, newer, is passed over)."""
    _log(tmp_path / 'work' / '20250101_000000', [(_train(1, 1.0), 1), (VAL, 0)])
    evaluation = _log(tmp_path / 'work' / '20250101_000100', [(VAL, 0)])
    os.utime(evaluation, (2e9, 2e9))
    run = tool(tmp_path / 'work', '--out', tmp_path / 'c.png', cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert '20250101_000000' in run.stdout and (tmp_path / 'c.png').is_file()
    for args, message in [((tmp_path / 'nope',), 'does not exist: give a scalars.json or a work dir'),
                          ((tmp_path / 'work' / '20250101_000100',), 'no training run under'),
                          ((tmp_path / 'work', '--metrics', 'mIoU'), 'has no validation key mIoU')]:
        run = tool(*args, '--out', tmp_path / 'd.png', cwd=tmp_path)
        assert run.returncode == 1 and 'Traceback' not in run.stderr
        assert message in run.stderr.strip().splitlines()[-1]
        assert not (tmp_path / 'd.png').exists()


# ------------------------------------------------------------------------------ a real run's log
@pytest.fixture(scope='module')
def run_log(shapes, tmp_path_factory):
    """The scalars.json of the detection demo trained 4 iterations on the tiny shapes data,
    evaluated after iterations 2 and 4 (LoggerHook's defaults)."""
    work = tmp_path_factory.mktemp('curves_run')
    d = shapes
    cmd = [sys.executable, os.path.join(ROOT, 'tools', 'train.py'), DEMO_DET, '--work-dir',
           str(work), '--cfg-options', f'train_dataloader.dataset.data_root={d}/',
           f'val_dataloader.dataset.data_root={d}/',
           f'val_evaluator.ann_file={d}/annotations/instances_val.json',
           'model.backbone.arch=nano_12_p16', 'train_cfg.max_iters=4', 'train_cfg.val_interval=2',
           'train_cfg.val_begin=2', 'param_scheduler.0.end=2', 'param_scheduler.1.begin=2',
           'param_scheduler.1.end=4', 'default_hooks.logger.interval=1',
           'default_hooks.checkpoint.interval=4', 'train_dataloader.num_workers=0',
           'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
           'val_dataloader.persistent_workers=False']
    out = subprocess.run(cmd, cwd=str(work), env=ENV, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return find_scalars(str(work))


@pytest.mark.slow
def test_a_real_runs_curves(run_log, tmp_path):
    """The demo detector's log: its six losses at iterations 1-4, its mAPs after 2 and 4, as
    the file has them; drawn. ~20-50 s: the module's training run (4 iterations, 2
    evaluations)."""
    with open(run_log) as f:
        rows = [json.loads(line) for line in f]
    s = read_scalars(run_log)
    assert s.losses == ['loss', 'loss_bbox', 'loss_cls', 'loss_mask', 'loss_rpn_bbox',
                        'loss_rpn_cls']
    assert s.train['loss'] == ([1.0, 2.0, 3.0, 4.0], [r['loss'] for r in rows if 'loss' in r])
    maps = [r['coco/bbox_mAP'] for r in rows if 'coco/bbox_mAP' in r]
    assert s.val['coco/bbox_mAP'] == ([2.0, 4.0], maps)
    out = plot_curves(s, str(tmp_path / 'curves.png'))
    assert cv2.imread(out).shape == (360, 1000, 3)


@pytest.mark.slow
@pytest.mark.parametrize('library', ['mmdet', 'mmseg'])
def test_mmdet_and_mmseg_analyze_logs_draw_our_log(run_log, tmp_path, library):
    """``mim run mmdet analyze_logs plot_curve LOG --keys loss loss_cls`` and ``mim run mmseg
    analyze_logs LOG --keys loss coco/bbox_mAP`` (docs/visualization.md) draw the demo
    detector's log. ~5 s: mim and the script, each a process (the run: test_a_real_runs_curves)."""
    if importlib.util.find_spec(library) is None:
        pytest.skip(f'{library} is not installed')
    mim = os.path.join(os.path.dirname(sys.executable), 'mim')
    keys = ['loss', 'loss_cls'] if library == 'mmdet' else ['loss', 'coco/bbox_mAP']
    cmd = [mim, 'run', library, 'analyze_logs', *(['plot_curve'] if library == 'mmdet' else []),
           run_log, '--keys', *keys, '--backend', 'Agg', '--out', str(tmp_path / 'c.png')]
    # the scripts import seaborn, in neither library's requirements: the tests extra brings it
    out = subprocess.run(cmd, cwd=str(tmp_path), env=ENV, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and 'The script finished successfully' in out.stdout, \
        out.stdout[-3000:] + out.stderr[-3000:]
    assert [f'metric is {k}' in out.stdout for k in keys] == [True] * len(keys)
    assert cv2.imread(str(tmp_path / 'c.png')) is not None
