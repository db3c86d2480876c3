"""Reliability of training runs: crash + resume equals an uninterrupted run (a kill during a
checkpoint write included), broken last checkpoints skipped, deterministic losses."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import ROOT, TESTS, run_in_process

from deepvit_mm.checkpoints import find_resumable_checkpoint, read_checkpoint

CFG = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
ENV = dict(os.environ, PYTHONWARNINGS='ignore', OMP_NUM_THREADS='2')



def _train_cmd(data, work_dir, max_iters, ckpt_every, *extra, opts=()):
    return [sys.executable, os.path.join(ROOT, 'tools', 'train.py'), CFG, '--work-dir',
            str(work_dir), *extra, '--cfg-options',
            f'train_dataloader.dataset.data_root={data}/',
            f'val_dataloader.dataset.data_root={data}/',
            f'val_evaluator.ann_file={data}/annotations/instances_val.json',
            'model.backbone.arch=nano_12_p16', 'train_dataloader.batch_size=2',
            f'train_cfg.max_iters={max_iters}', f'train_cfg.val_interval={10 * max_iters}',
            'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None',
            f'param_scheduler.0.end={max_iters // 2}', f'param_scheduler.1.begin={max_iters // 2}',
            f'param_scheduler.1.end={max_iters}', f'default_hooks.checkpoint.interval={ckpt_every}',
            'default_hooks.checkpoint.max_keep_ckpts=-1', 'default_hooks.logger.interval=1', *opts]


def _run(cmd):
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _weights(path):
    return read_checkpoint(str(path))['state_dict']


def _losses(work_dir) -> list:
    """The (iteration, loss) pairs each run in ``work_dir`` logged, a list per run, oldest first
    (mmengine's run folders are named by their start time)."""
    runs = sorted(d for d in os.listdir(work_dir) if os.path.isdir(os.path.join(work_dir, d)))
    logged = []
    for run in runs:
        with open(os.path.join(work_dir, run, 'vis_data', 'scalars.json')) as f:
            rows = [json.loads(line) for line in f]
        logged.append([(r['iter'], r['loss']) for r in rows if 'loss' in r])
    return logged


@pytest.fixture(scope='module')
def reference(shapes, tmp_path_factory):
    """6 steps that nothing interrupts, a checkpoint every 2."""
    ref = tmp_path_factory.mktemp('reference')
    _run(_train_cmd(shapes, ref, 6, 2))
    return ref


def _kill_when(proc, done, what):
    deadline = time.time() + 300
    while not done() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f'training ended before {what}'
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_kill_during_a_checkpoint_write_loses_nothing_complete(reference, shapes, tmp_path):
    """With max_keep_ckpts=1, a run killed (SIGKILL) while it writes iter_4 keeps iter_2
    (mmengine's own hook deletes it first), resumes from it, leaves no temp file and ends
    bit-identical to an uninterrupted run (the module's reference). The same seed gives the same
    losses: the killed run logs the reference's first 4, bit for bit, and the resumed run its
    last 4. ~30-40 s: two training processes (and the reference's, the first test to use it)."""
    crash = tmp_path / 'crash'
    keep1 = ['default_hooks.checkpoint.max_keep_ckpts=1']
    marker = tmp_path / 'writing'
    env = dict(ENV, PYTHONPATH=TESTS,
               SLOW_SAVE_MATCH='iter_4.pth', SLOW_SAVE_MARKER=str(marker))
    train = _train_cmd(shapes, crash, 6, 2, opts=keep1)
    cmd = [sys.executable, '-c', 'import runpy, sys, slow_save; sys.argv = sys.argv[1:]; '
           'runpy.run_path(sys.argv[0], run_name="__main__")', *train[1:]]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    _kill_when(proc, marker.exists, 'the iter_4 write')
    def saved():  # what the checkpoint hook wrote (mmengine also dumps the config there)
        return sorted(n for n in os.listdir(crash) if '.pth' in n or n == 'last_checkpoint')
    assert saved() == ['iter_2.pth', 'iter_4.pth.tmp', 'last_checkpoint']
    assert (crash / 'last_checkpoint').read_text() == str(crash / 'iter_2.pth')
    out = _run(_train_cmd(shapes, crash, 6, 2, '--resume', opts=keep1))
    log = out.stdout + out.stderr
    assert 'resumed epoch: 0, iter: 2' in log and 'removed iter_4.pth.tmp' in log
    assert saved() == ['iter_6.pth', 'last_checkpoint']
    want, got = _weights(reference / 'iter_6.pth'), _weights(crash / 'iter_6.pth')
    assert want.keys() == got.keys()
    diff = [k for k in want if not torch.equal(want[k], got[k])]
    assert not diff, f'{len(diff)} tensors differ, e.g. {diff[:3]}'
    (ref,), (killed, resumed) = _losses(reference), _losses(crash)
    assert len(ref) == 6 and killed == ref[:4] and resumed == ref[2:]


@pytest.mark.slow
def test_non_finite_loss_stops_training(shapes, tmp_path, monkeypatch):
    """tools/train.py, in this process (the other tests start it as a process): the first
    iteration's loss is NaN and the run stops with what happened and what was saved."""
    cmd = _train_cmd(shapes, tmp_path / 'wd', 6, 2,
                     opts=['model.roi_head.bbox_head.loss_bbox.loss_weight=nan'])
    monkeypatch.chdir(ROOT)
    with pytest.raises(FloatingPointError) as e:
        run_in_process(monkeypatch, *cmd[1:])
    assert str(e.value).startswith('training stopped: at iteration 1 the loss is not finite')
    assert 'loss_bbox=nan' in str(e.value) and 'No checkpoint was saved before it' in str(e.value)
    assert not [n for n in os.listdir(tmp_path / 'wd') if n.endswith('.pth')]


def _resumable_copy(reference, wd) -> None:
    """``wd`` as a run that stopped after the reference's step 2 leaves it (its checkpoint, and
    ``last_checkpoint`` naming it)."""
    import shutil
    wd.mkdir(parents=True)
    shutil.copy(reference / 'iter_2.pth', wd / 'iter_2.pth')
    (wd / 'last_checkpoint').write_text(str(wd / 'iter_2.pth'))


@pytest.mark.slow
def test_disk_full_during_a_checkpoint_write_stops_with_one_message(reference, shapes, tmp_path):
    """A real run resumed (from the reference run's step 2) under a file-size limit below a
    checkpoint's size (RLIMIT_FSIZE: the write fails with EFBIG, as on a full disk or quota): one
    message, the previous checkpoint kept and named, no temporary file left. ~15 s: a tool's
    process."""
    import resource
    wd = tmp_path / 'wd'
    _resumable_copy(reference, wd)
    size = os.path.getsize(wd / 'iter_2.pth')

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))
    out = subprocess.run(_train_cmd(shapes, wd, 6, 2, '--resume'), cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=600, preexec_fn=limit)
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r'training stopped: could not write the checkpoint \S+/iter_4\.pth \(EFBIG: File too '
        r'large\)\. The previous complete checkpoint, \S+/iter_2\.pth, is kept\. No partial file '
        r'was left\. Free space .*, then continue with tools/train\.py CONFIG --resume\.', last), last
    assert 'Traceback' not in out.stderr
    assert sorted(n for n in os.listdir(wd) if 'iter_' in n) == ['iter_2.pth']
    assert (wd / 'last_checkpoint').read_text().strip().endswith('iter_2.pth')
    assert find_resumable_checkpoint(str(wd)).endswith('iter_2.pth')


def test_a_failed_last_checkpoint_write_keeps_the_old_one_and_leaves_no_temporary_file(
        tmp_path, monkeypatch):
    """``last_checkpoint`` is written beside a checkpoint, atomically: when that write fails,
    the file keeps naming the previous checkpoint and its temporary file is removed."""
    import errno

    from deepvit_mm.engine.hooks import crash_safe_checkpoint_hook as hooks
    marker = tmp_path / 'last_checkpoint'
    marker.write_text('/old/iter_2.pth')

    def full(tmp, final):
        raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(hooks, '_commit', full)
    with pytest.raises(OSError, match='No space left'):
        hooks._write_text_atomically(str(marker), '/new/iter_4.pth')
    assert os.listdir(tmp_path) == ['last_checkpoint']
    assert marker.read_text() == '/old/iter_2.pth'


def test_a_sharded_checkpoint_is_renamed_once_every_process_wrote_its_part(tmp_path,
                                                                          monkeypatch):
    """A sharded checkpoint (``state_dict_cfg='local'``) is a folder with one part per process,
    each written into ``<name>.tmp/``: the main process renames the folder only once every
    process has reached the barrier after its write (a slower part written after the rename made
    a new ``.tmp`` folder and was lost). Here the other process's part is written while the
    main process waits at the barrier; a leftover ``.tmp`` folder is removed at the next start."""
    from types import SimpleNamespace

    from mmengine.logging import MessageHub, MMLogger

    from deepvit_mm.engine.hooks import crash_safe_checkpoint_hook as hooks

    def save_checkpoint(out_dir, name, *args, **kwargs):  # as FSDPStrategy's local saving
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        torch.save({'part': 0}, os.path.join(out_dir, name, 'rank0.pth'))

    def barrier():  # the other process finishes its part before the barrier lets anyone on
        torch.save({'part': 1}, tmp_path / 'iter_2.pth.tmp' / 'rank1.pth')

    monkeypatch.setattr(hooks, 'barrier', barrier)
    hook = hooks.CrashSafeCheckpointHook(interval=1, by_epoch=False)
    hook.out_dir, hook.file_backend = str(tmp_path), hooks.LocalBackend()
    runner = SimpleNamespace(save_checkpoint=save_checkpoint, work_dir=str(tmp_path),
                             message_hub=MessageHub.get_instance('sharded_checkpoint_test'),
                             logger=MMLogger.get_instance('sharded_checkpoint_test'))
    hook._save_checkpoint_with_step(runner, 2, {})
    assert sorted(os.listdir(tmp_path)) == ['iter_2.pth', 'last_checkpoint']
    assert sorted(os.listdir(tmp_path / 'iter_2.pth')) == ['rank0.pth', 'rank1.pth']
    (tmp_path / 'iter_4.pth.tmp').mkdir()  # a killed sharded save
    (tmp_path / 'iter_4.pth.tmp' / 'rank0.pth').write_bytes(b'')
    hook.before_train(runner)
    assert sorted(os.listdir(tmp_path)) == ['iter_2.pth', 'last_checkpoint']


def test_resume_skips_an_incomplete_last_checkpoint(tmp_path):
    torch.save({'state_dict': {'w': torch.ones(3)}, 'meta': {}}, tmp_path / 'iter_4.pth')
    torch.save({'state_dict': {'w': torch.ones(1000)}, 'meta': {}}, tmp_path / 'iter_8.pth')
    data = (tmp_path / 'iter_8.pth').read_bytes()
    (tmp_path / 'iter_8.pth').write_bytes(data[: len(data) // 3])  # killed mid-write
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_8.pth'))
    assert find_resumable_checkpoint(str(tmp_path)) == str(tmp_path / 'iter_4.pth')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_'))  # itself cut short
    assert find_resumable_checkpoint(str(tmp_path)) == str(tmp_path / 'iter_4.pth')
    assert find_resumable_checkpoint(str(tmp_path / 'nothing_here')) is None


def _stopped(in_process, cmd, cwd) -> str:
    """What a tool's command line run in this process (the tools' start as processes is tested
    above) printed when it stopped with a failure."""
    out = in_process(*cmd[1:], cwd=cwd)
    assert out.returncode != 0, 'the tool did not stop'
    return out.stderr


@pytest.mark.slow
def test_resume_never_evaluates_config_text_planted_in_the_checkpoint(reference, shapes,
                                                                      tmp_path, in_process):
    """mmengine's Runner.resume evaluates meta['config'] with Config.fromstring: code planted there
    (in the reference run's checkpoint, otherwise plain data) does not run; the run stops with a
    message. (tools/train.py runs in this process.)"""
    ckpt = torch.load(reference / 'iter_2.pth', weights_only=False)  # our own file, read in full
    ckpt['meta']['config'] = "import os\nos.system('touch PWNED')\ngpu_ids = [0]\n"
    planted = tmp_path / 'planted.pth'
    torch.save(ckpt, planted)
    err = _stopped(in_process, _train_cmd(shapes, tmp_path / 'wd2', 6, 2, '--resume',
                                          str(planted)), tmp_path)
    assert "did not evaluate the config text stored in checkpoint" in err
    assert "checkpoint['meta']['config']" in err and 'DEEPVIT_MM_TRUSTED_CHECKPOINTS' in err
    assert not (tmp_path / 'PWNED').exists()


class _Payload:
    def __reduce__(self):
        return (os.system, ('touch PWNED_BY_CHECKPOINT',))


@pytest.mark.parametrize('tool', ['test', 'resume'])
@pytest.mark.slow
def test_pickle_payload_refused_by_the_tools(shapes, tmp_path, tool, in_process):
    """``tools/test.py CKPT`` and ``tools/train.py --resume CKPT`` refuse a checkpoint that would
    run a command when unpickled, say why, and run nothing (each runs in this process)."""
    evil = tmp_path / 'evil.pth'
    torch.save({'state_dict': {}, 'meta': _Payload()}, evil)
    if tool == 'test':
        cmd = [sys.executable, os.path.join(ROOT, 'tools', 'test.py'), CFG, str(evil),
               '--work-dir', str(tmp_path / 'wd'), '--cfg-options',
               f'test_dataloader.dataset.data_root={shapes}/',
               f'test_evaluator.ann_file={shapes}/annotations/instances_val.json',
               'model.backbone.arch=nano_12_p16']
    else:
        cmd = _train_cmd(shapes, tmp_path / 'wd', 4, 4, '--resume', str(evil))
    err = _stopped(in_process, cmd, tmp_path)
    assert 'refusing to load' in err and 'posix.system' in err
    assert not (tmp_path / 'PWNED_BY_CHECKPOINT').exists()
