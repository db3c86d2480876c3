"""Hooks for tests/engine/distributed/test_distributed.py (imported by the training processes, not
collected by pytest): every rank saves the weights it starts and ends with, the elements of model
state it holds and the images it trained on (``RankDumpHook``); every rank writes its pid, and one
hangs at a given iteration for the test to kill it (``KillPointHook``)."""
import os
import os.path as osp
import time

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from torch.distributed.fsdp import FullyShardedDataParallel


@HOOKS.register_module()
class RankDumpHook(Hook):
    priority = 'LOWEST'

    def __init__(self) -> None:
        self.images, self.initial = [], None

    def _params(self, runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    def before_train(self, runner) -> None:
        self.initial = self._params(runner)
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        self.initial_buffers = {n: b.detach().clone() for n, b in model.named_buffers()}

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.images += [s.img_path for s in data_batch['data_samples']]

    def after_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        state = runner.optim_wrapper.optimizer.state.values()
        held = dict(weights=sum(p.numel() for p in runner.model.parameters()),
                    optimizer=sum(t.numel() for s in state for t in s.values()
                                  if torch.is_tensor(t) and t.dim() > 0))  # not AdamW's step
        torch.save(dict(initial=self.initial, initial_buffers=self.initial_buffers, held=held,
                        final=self._params(runner), images=self.images,
                        wrapper=type(runner.model).__name__,
                        units=sum(isinstance(m, FullyShardedDataParallel)
                                  for m in runner.model.modules()),
                        norms=sorted({type(m).__name__ for m in model.modules()
                                      if 'Norm' in type(m).__name__})),
                   osp.join(runner.work_dir, f'rank{runner.rank}.pth'))


@HOOKS.register_module()
class KillPointHook(Hook):
    """Once per work dir: every rank writes its pid to ``work_dir/rank<r>.pid`` before training;
    rank ``rank`` writes ``work_dir/hang`` after iteration ``after_iter`` (1-based) and hangs there,
    for the test to kill a worker. Once ``hang`` exists it does nothing: a restarted group must not
    hang again. (``TORCHELASTIC_RESTART_COUNT`` cannot tell: on two nodes the agent whose worker
    survived restarts its group for the new membership without counting a restart, and the
    rendezvous may give that worker rank 1.)"""
    priority = 'HIGHEST'  # before the checkpoint hook of that iteration

    def __init__(self, rank: int = 1, after_iter: int = 0) -> None:
        self.rank, self.after_iter = rank, after_iter

    def _first(self, runner) -> bool:
        return not osp.exists(osp.join(runner.work_dir, 'hang'))

    def before_train(self, runner) -> None:
        if self._first(runner):
            with open(osp.join(runner.work_dir, f'rank{runner.rank}.pid'), 'w') as f:
                f.write(str(os.getpid()))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if (runner.rank == self.rank and runner.iter + 1 == self.after_iter
                and self._first(runner)):
            open(osp.join(runner.work_dir, 'hang'), 'w').close()
            time.sleep(600)
