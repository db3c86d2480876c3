"""Runner hooks: the neck's and heads' channels checked before a run, crash-safe checkpoints, a stop
on non-finite losses, RNG state in checkpoints.

Each is registered in mmengine's ``HOOKS`` under its own name; nothing of mmengine's own hooks
changes. The recipes use all four (``configs/_base_``); in your own configs::

    default_hooks = dict(checkpoint=dict(type='CrashSafeCheckpointHook', interval=1))
    custom_hooks = [dict(type='CheckConsumersHook'), dict(type='FiniteLossHook'),
                    dict(type='RNGStateHook')]
"""
import logging
import os
import os.path as osp
import random
import re
from typing import Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size, is_main_process
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ..consumers import check_model

__all__ = ['CheckConsumersHook', 'CrashSafeCheckpointHook', 'CheckpointWriteError',
           'FiniteLossHook', 'RNGStateHook']

_TMP = '.tmp'


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(tmp: str, final: str) -> None:
    """Make ``tmp`` durable, then rename it over ``final`` (atomic on POSIX filesystems)."""
    _fsync_path(tmp)
    os.replace(tmp, final)
    _fsync_path(osp.dirname(osp.abspath(final)))


def _write_text_atomically(path: str, text: str) -> None:
    """``path`` holds ``text`` or, if writing fails, what it held before (no temporary file is
    left)."""
    tmp = path + _TMP
    try:
        with open(tmp, 'w') as f:
            f.write(text)
        _commit(tmp, path)
    except OSError:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, permissions): training stops; the
    message names the file, the reason, and the previous complete checkpoint, which is kept."""


def _previous_checkpoint(work_dir: str) -> Optional[str]:
    try:
        with open(osp.join(work_dir, 'last_checkpoint')) as f:
            named = f.read().strip()
        return named if named and osp.isfile(named) else None
    except OSError:
        return None


def _write_failed(path: str, error: OSError, previous: Optional[str]) -> CheckpointWriteError:
    import errno
    code = errno.errorcode.get(error.errno, str(error.errno)) if error.errno else type(error).__name__
    kept = (f'The previous complete checkpoint, {previous}, is kept.' if previous else
            'No checkpoint of this run was complete yet.')
    return CheckpointWriteError(
        f'training stopped: could not write the checkpoint {path} ({code}: '
        f'{error.strerror or error}). {kept} No partial file was left. Free space (or raise the '
        'quota, or make the folder writable), then continue with tools/train.py CONFIG --resume.')


@HOOKS.register_module()
class CheckConsumersHook(Hook):
    """Before a run (training, validation or test) starts, check that the model's neck or heads
    were built for the channels and levels its ``ColumnarBackbone`` feeds them
    (``deepvit_mm.consumers``): a mismatch stops with ``ChannelMismatchError`` naming the config
    keys to set, instead of a shape error inside the neck at the first iteration. Models with
    another backbone are not checked.
    """
    priority = 'HIGHEST'  # before any other hook's before_run does work for a run that cannot go

    def before_run(self, runner) -> None:
        check_model(runner.model)


@HOOKS.register_module()
class CrashSafeCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments) whose files survive a kill at any moment.

    mmengine deletes the oldest checkpoint *before* writing the new one and writes in place, so a
    run killed during a save with ``max_keep_ckpts=1`` keeps no complete checkpoint. Here:

    * a checkpoint is written to ``<name>.tmp``, flushed to disk and renamed: it is complete or
      absent under its own name; ``last_checkpoint`` is rewritten the same way;
    * the checkpoint beyond ``max_keep_ckpts`` is deleted only after the new one is complete;
    * ``.tmp`` files a killed save left in the checkpoint folder are removed when training
      (re)starts;
    * a save that fails (disk full, quota, permissions) removes its ``.tmp`` and stops training with
      ``CheckpointWriteError``, which names the file, the reason (errno) and the previous
      complete checkpoint, kept.

    Local folders only; other storage backends get mmengine's behaviour.
    """

    def before_train(self, runner) -> None:
        super().before_train(runner)
        if not isinstance(self.file_backend, LocalBackend) or not is_main_process() \
                or not osp.isdir(self.out_dir):
            return
        pattern = re.compile(re.escape(self.filename_tmpl).replace(r'\{\}', r'\d+')
                             + re.escape(_TMP))
        for name in os.listdir(self.out_dir):
            if pattern.fullmatch(name):
                os.remove(osp.join(self.out_dir, name))
                print_log(f'removed {name}, left by a save that was interrupted',
                          logger='current', level=logging.WARNING)

    def _save_checkpoint_with_step(self, runner, step, meta) -> None:
        if not isinstance(self.file_backend, LocalBackend):
            return super()._save_checkpoint_with_step(runner, step, meta)
        stale: Optional[int] = None
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                stale = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))
        name = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, name)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        try:
            runner.save_checkpoint(
                self.out_dir, name + _TMP, self.file_client_args,
                save_optimizer=self.save_optimizer, save_param_scheduler=self.save_param_scheduler,
                meta=meta, by_epoch=self.by_epoch, backend_args=self.backend_args, **self.args)
            if not is_main_process():
                return
            _commit(self.last_ckpt + _TMP, self.last_ckpt)
            _write_text_atomically(osp.join(runner.work_dir, 'last_checkpoint'), self.last_ckpt)
        except OSError as e:  # last_checkpoint still names the previous complete checkpoint
            if osp.exists(self.last_ckpt + _TMP):
                os.remove(self.last_ckpt + _TMP)
            raise _write_failed(self.last_ckpt, e, _previous_checkpoint(runner.work_dir)) from e
        if stale is not None:
            old = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(stale))
            if self.file_backend.isfile(old):
                self.file_backend.remove(old)
            elif self.file_backend.isdir(old):  # checkpoints saved by deepspeed are folders
                self.file_backend.rmtree(old)


@HOOKS.register_module()
class FiniteLossHook(Hook):
    """Stop training at the first iteration whose loss is NaN or infinite.

    A diverged run otherwise trains to the end on ``loss: nan``, overwrites its good checkpoints
    with NaN weights and exits 0. This runs before the logger and checkpoint hooks, so the
    iteration that diverged is not saved. (mmdet's ``CheckInvalidLossHook`` checks every 50
    iterations with an ``assert``, and mmseg has none.)
    """
    priority = 'VERY_HIGH'

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not outputs:
            return
        scalars = {k: float(v.detach()) if torch.is_tensor(v) else v
                   for k, v in outputs.items()
                   if torch.is_tensor(v) and v.numel() == 1 or isinstance(v, float)}
        bad = {k: v for k, v in scalars.items() if not np.isfinite(v)}
        if not bad:
            return
        last = None
        if osp.isfile(osp.join(runner.work_dir, 'last_checkpoint')):
            with open(osp.join(runner.work_dir, 'last_checkpoint')) as f:
                last = f.read().strip()
        raise FloatingPointError(
            f'training stopped: at iteration {runner.iter + 1} the loss is not finite ('
            + ', '.join(f'{k}={v}' for k, v in bad.items()) + '). Check the learning rate and its '
            'warm-up (optim_wrapper.optimizer.lr, param_scheduler), gradient clipping '
            '(optim_wrapper.clip_grad), mixed precision (--amp), the loss weights, and the '
            'annotations (empty or degenerate boxes). '
            + (f'The last complete checkpoint is {last}: fix the cause, then resume with --resume.'
               if last else 'No checkpoint was saved before it.'))


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


