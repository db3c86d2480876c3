"""Distributed training: 2 CPU processes (torchrun via tools/dist_train.sh, gloo) end with the same
weights; tools/slurm_train.sh hands the right command to srun; mmengine keeps SyncBN in
distributed runs and reverts it in single-process ones."""
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.registry import MODEL_WRAPPERS
from mmengine.runner import Runner

from deepvit_mm.checkpoints import read_checkpoint
from deepvit_mm.runtime import setup_cpu_distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]



def test_two_cpu_processes_end_with_identical_weights(shapes, tmp_path):
    iters = 4
    cfg = tmp_path / 'dist_cfg.py'
    cfg.write_text(textwrap.dedent(f"""
        _base_ = {CFG!r}
        custom_imports = dict(imports=['deepvit_mm', 'rank_dump_hook'], allow_failed_imports=False)
        custom_hooks = [dict(type='RNGStateHook'), dict(type='RankDumpHook')]
        # the recipes ask for SyncBN; it has no CPU implementation and is reverted on CPU
        model = dict(backbone=dict(arch='nano_12_p16',
                                   norm_cfg=dict(type='SyncBN', requires_grad=True)))
        """))
    work = tmp_path / 'work'
    env = dict(os.environ, PYTHONWARNINGS='ignore', OMP_NUM_THREADS='1', PORT=str(_free_port()),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', ''),
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, 'tests'), ROOT]))
    cmd = ['bash', os.path.join(ROOT, 'tools', 'dist_train.sh'), str(cfg), '2', '--work-dir',
           str(work), '--cfg-options', f'train_dataloader.dataset.data_root={shapes}/',
           'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
           'train_dataloader.persistent_workers=False', f'train_cfg.max_iters={iters}',
           'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None',
           'param_scheduler.0.end=2', 'param_scheduler.1.begin=2', f'param_scheduler.1.end={iters}',
           'default_hooks.logger.interval=1', f'default_hooks.checkpoint.interval={iters}']
    t0 = time.time()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.time() - t0
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-5000:]
    print(f'2-process training: {wall:.1f} s')

    r0, r1 = (read_checkpoint(str(work / f'rank{r}.pth')) for r in (0, 1))
    assert r0['wrapper'] == r1['wrapper'] == 'CPUDistributedDataParallel'
    assert "distributed backend 'nccl' -> gloo" in log  # the demo config inherits nccl
    assert 'SyncBN has no CPU implementation' in log
    assert not any('SyncBatchNorm' in n for n in r0['norms'])
    # each rank trained on its own share of the data, so only the gradient all-reduce can
    # keep the weights equal
    assert len(r0['images']) == len(r1['images']) == 2 * iters
    assert set(r0['images']) != set(r1['images'])
    assert r0['final'].keys() == r1['final'].keys()
    differ = [k for k in r0['final'] if not torch.equal(r0['final'][k], r1['final'][k])]
    assert not differ, f'{len(differ)} tensors differ between the ranks, e.g. {differ[:3]}'
    moved = [k for k in r0['final'] if not torch.equal(r0['final'][k], r0['initial'][k])]
    assert len(moved) > 0.9 * len(r0['final'])  # it did train
    # and rank 0's checkpoint holds them
    saved = read_checkpoint(str(work / f'iter_{iters}.pth'))['state_dict']
    assert all(torch.equal(saved[k], v) for k, v in r0['final'].items())


def test_slurm_train_hands_the_command_to_srun(tmp_path):
    fake = tmp_path / 'srun'
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$SRUN_LOG"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / 'args'
    env = dict(os.environ, PATH=f'{tmp_path}{os.pathsep}{os.environ["PATH"]}', SRUN_LOG=str(log),
               GPUS='16', SRUN_ARGS='--quotatype=auto --exclusive')
    script = os.path.join(ROOT, 'tools', 'slurm_train.sh')
    out = subprocess.run(['bash', script, 'part', 'job', 'configs/x.py', 'work_dirs/x', '--amp',
                          '--cfg-options', 'a=1'], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    args = log.read_text().splitlines()
    assert args[:2] == ['-p', 'part']
    assert {'--job-name=job', '--gres=gpu:8', '--ntasks=16', '--ntasks-per-node=8',
            '--cpus-per-task=5', '--kill-on-bad-exit=1', '--quotatype=auto',
            '--exclusive'} <= set(args)
    py = args.index('python')
    assert args[py:] == ['python', '-u', os.path.join(os.path.dirname(script), 'train.py'),
                         'configs/x.py', '--work-dir=work_dirs/x', '--launcher=slurm', '--amp',
                         '--cfg-options', 'a=1']
    usage = subprocess.run(['bash', script, 'part'], env=env, capture_output=True, text=True)
    assert usage.returncode == 2 and 'usage' in usage.stderr


@MODEL_WRAPPERS.register_module(force=True)
class SyncBNProbeWrapper(torch.nn.Module):
    """Stands in for DistributedDataParallel (which needs GPUs for a model with SyncBN)."""

    def __init__(self, module):
        super().__init__()
        self.module = module


@pytest.mark.parametrize('distributed', [False, True])
def test_mmengine_keeps_syncbn_only_when_distributed(distributed):
    """What the recipes rely on: Runner.wrap_model reverts SyncBN to BN in a single-process run
    and keeps it in a distributed one."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    model = MODELS.build(dict(type='XCiT', arch='nano_12_p16',
                              norm_cfg=dict(type='SyncBN', requires_grad=True)))
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    runner = Runner.__new__(Runner)  # only wrap_model's inputs: no work dir, no logger files
    runner._distributed, runner.cfg = distributed, Config(dict())
    runner.logger = type('Log', (), {'info': staticmethod(lambda *a: None)})()
    wrapped = runner.wrap_model(dict(type='SyncBNProbeWrapper'), model)
    inner = wrapped.module if distributed else wrapped
    has_sync = any(isinstance(m, torch.nn.SyncBatchNorm) for m in inner.modules())
    assert has_sync == distributed


def test_setup_cpu_distributed(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(dist, 'is_initialized', lambda: True)  # no process group needed here
    cfg = Config(dict(launcher='pytorch', env_cfg=dict(dist_cfg=dict(backend='nccl', timeout=60))))
    setup_cpu_distributed(cfg)
    assert cfg.env_cfg.dist_cfg == dict(backend='gloo', timeout=60)
    assert cfg.model_wrapper_cfg == dict(type='CPUDistributedDataParallel',
                                         broadcast_buffers=False, find_unused_parameters=False)
    single = Config(dict(launcher='none'))
    setup_cpu_distributed(single)
    assert 'model_wrapper_cfg' not in single
    with pytest.raises(RuntimeError, match='torchrun'):
        setup_cpu_distributed(Config(dict(launcher='slurm')))
