"""GlobalNormFSDPStrategy's gradient clipping (``DDPNormClip``) on 3 CPU processes: the norm, the
coefficient and the clipped gradients are those ``torch.nn.utils.clip_grad_norm_`` computes from
the whole gradients (as under DDP), bit for bit, where parameters are split across 2 and 3
processes. (Whole runs, DDP against FSDP: test_distributed.py.)"""
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from mmengine.optim import OptimWrapper
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from deepvit_mm.engine.distributed.ddp import cpu_fsdp_problem
from deepvit_mm.engine.distributed.fsdp import DDPNormClip

WORLD, TRIALS = 3, 8


def _clip_on_one_process(rank: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)  # a forked process: no OpenMP pool of the parent's
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=WORLD)
    cpu = torch.device('cpu')
    torch.manual_seed(0)
    # 3 FSDP units; the first weight of the first inner unit (4257 of its 4776 values) lies on all
    # 3 processes, the others' weights on 2
    model = FSDP(nn.Sequential(
        nn.Linear(7, 33), nn.Tanh(),
        FSDP(nn.Sequential(nn.Linear(33, 129), nn.GELU(), nn.Linear(129, 3)),
             use_orig_params=True, device_id=cpu),
        FSDP(nn.Sequential(nn.Linear(3, 65), nn.GELU(), nn.Linear(65, 33)),
             use_orig_params=True, device_id=cpu),
        nn.Linear(33, 5)), use_orig_params=True, device_id=cpu)
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    clip = DDPNormClip(model, wrapper)
    results = []
    for trial in range(TRIALS):  # other gradients: the order of a sum matters in some of them
        model.zero_grad()
        torch.manual_seed(100 * trial + rank)  # each process its own batch
        model(torch.randn(4, 7)).square().sum().backward()
        with FSDP.summon_full_params(model, with_grads=True):
            whole = [p.grad.clone() for p in model.parameters()]
        pieces = [-1 if p.grad is None else p.grad.numel() for p in model.parameters()]
        # clip_grad_norm_ on the whole gradients, in the optimizer's order: what DDP computes
        reference = [nn.Parameter(g.clone()) for g in whole]
        for p, g in zip(reference, whole):
            p.grad = g.clone()
        max_norm = 0.3 * torch.nn.utils.get_total_norm(whole).item()
        want = torch.nn.utils.clip_grad_norm_(reference, max_norm)
        fsdps = model.clip_grad_norm_(1e9)  # FSDP's own norm; a coefficient of 1 changes nothing
        got = clip(None, max_norm)
        with FSDP.summon_full_params(model, with_grads=True):
            clipped = [p.grad.clone() for p in model.parameters()]
        results.append(dict(got=got, want=want, fsdps=fsdps, pieces=pieces,
                            same=[torch.equal(c, r.grad) for c, r in zip(clipped, reference)],
                            scaled=[not torch.equal(c, w) for c, w in zip(clipped, whole)]))
    torch.save(results, os.path.join(out, f'rank{rank}.pth'))
    dist.destroy_process_group()


@pytest.mark.skipif(cpu_fsdp_problem() is not None, reason=str(cpu_fsdp_problem()))
@pytest.mark.distributed
def test_sharded_clipping_is_ddps_bit_for_bit(tmp_path):
    """3 processes (gloo), a model of three FSDP units, one weight on all 3 processes, 8 batches:
    each process returns the total norm clip_grad_norm_ returns for the whole gradients, and the
    gradients they end with, put together, are the ones it clips, bit for bit; FSDP's own
    clip_grad_norm_ misses that norm in the last bits for some of the batches (the order of its
    sum). ~1 s: the processes are forked, with this module's imports."""
    run = mp.start_processes(_clip_on_one_process, args=(str(tmp_path / 'init'), str(tmp_path)),
                             nprocs=WORLD, join=False, start_method='fork')
    deadline = time.time() + 120
    while not run.join(timeout=5):
        if time.time() > deadline:
            for p in run.processes:
                p.kill()
            pytest.fail('the 3 processes did not end within 120 s')
    ranks = [torch.load(tmp_path / f'rank{r}.pth') for r in range(WORLD)]
    for trials in ranks:
        for t in trials:
            assert t['got'].dtype == t['want'].dtype and torch.equal(t['got'], t['want'])
            assert all(t['same']) and all(t['scaled'])
    # what the test is about: a weight in 3 pieces, and norms whose order of summation shows
    assert all(trials[0]['pieces'][2] > 0 for trials in ranks)
    assert any(not torch.equal(t['fsdps'], t['want']) for t in ranks[0])
