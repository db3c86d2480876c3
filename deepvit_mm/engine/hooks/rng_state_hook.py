"""``RNGStateHook``: the random-number generators' states saved in checkpoints and restored on
resume. In a config::

    custom_hooks = [dict(type='RNGStateHook')]
"""
import logging
import random
from typing import Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

__all__ = ['RNGStateHook']


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Save the random-number generators' states in every checkpoint and restore them on resume,
    so a resumed run draws the same random numbers (RoI sampling, drop path...) as an uninterrupted
    one. mmengine re-seeds on resume but does not restore the states reached at the checkpoint.

    Every process draws its own numbers (each samples RoIs of its own images), so a distributed
    run's checkpoint holds each process's states (``rng_state['ranks']``) and each process takes
    its own back; resumed with another number of processes, rank 0's go to all and the log says
    the draws will differ. mmengine's Runner saves on rank 0 alone, so the states are gathered
    just before, in the iteration (or epoch) whose end a ``CheckpointHook`` saves at (this hook
    runs before it); a best-metric checkpoint saved after validation holds rank 0's only.

    Data augmentation runs in dataloader workers, which mmengine seeds per worker and which replay
    the skipped batches on resume, so use ``num_workers >= 1`` for bit-identical resumes.
    """
    priority = 'LOW'  # before the checkpoint hooks (VERY_LOW) at the end of an iteration

    def __init__(self) -> None:
        self._pending: Optional[dict] = None
        self._gathered: Optional[list] = None

    @staticmethod
    def _state() -> dict:
        state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                     python=random.getstate())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        return state

    def _gather_if_saving(self, runner, by_epoch: bool) -> None:
        if get_world_size() == 1:
            return
        for hook in runner.hooks:
            if not isinstance(hook, CheckpointHook) or hook.by_epoch != by_epoch:
                continue
            if by_epoch:
                saving = hook.every_n_epochs(runner, hook.interval, hook.save_begin) or (
                    hook.save_last and hook.is_last_train_epoch(runner))
            else:
                saving = hook.every_n_train_iters(runner, hook.interval, hook.save_begin) or (
                    hook.save_last and hook.is_last_train_iter(runner))
            if saving:  # every process is here; only rank 0 will call before_save_checkpoint
                self._gathered = all_gather_object(self._state())
                return

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._gather_if_saving(runner, by_epoch=False)

    def after_train_epoch(self, runner) -> None:
        self._gather_if_saving(runner, by_epoch=True)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = self._state()
        if self._gathered is not None:
            state, self._gathered = dict(self._gathered[0], ranks=self._gathered), None
        checkpoint['rng_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not getattr(runner, '_resume', False):
            return
        state = checkpoint.get('rng_state')
        if state is None:
            print_log('the resumed checkpoint has no RNG state (saved without RNGStateHook): '
                      'random draws will differ from an uninterrupted run.',
                      logger='current', level=logging.WARNING)
        elif 'ranks' in state or get_world_size() > 1:
            ranks = state.get('ranks', [state])
            if len(ranks) == get_world_size():
                state = ranks[get_rank()]
            else:
                print_log(f'the resumed checkpoint holds the RNG states of {len(ranks)} '
                          f'process(es), this run has {get_world_size()}: all take rank 0\'s, and '
                          'random draws will differ from an uninterrupted run.',
                          logger='current', level=logging.WARNING)
                state = ranks[0]
        self._pending = state

    def before_train(self, runner) -> None:
        # after mmengine's own re-seeding in Runner.resume()
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        torch.set_rng_state(state['torch'])
        np.random.set_state(state['numpy'])
        random.setstate(_as_tuple(state['python']))
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['cuda'])


def _as_tuple(x):
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x
