"""``CrashSafeCheckpointHook``: mmengine's ``CheckpointHook`` whose files survive a kill at any
moment (written to a temporary file, flushed, renamed), and ``CheckpointWriteError``. In a
config::

    default_hooks = dict(checkpoint=dict(type='CrashSafeCheckpointHook', interval=1))
"""
import logging
import os
import os.path as osp
import re
import shutil
from typing import Optional

from mmengine.dist import barrier, is_main_process
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

__all__ = ['CrashSafeCheckpointHook', 'CheckpointWriteError']

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


def _remove(path: str) -> None:
    """Remove a checkpoint file, or a sharded checkpoint's folder of per-process parts."""
    if osp.isdir(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


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
class CrashSafeCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments) whose files survive a kill at any moment.

    mmengine deletes the oldest checkpoint *before* writing the new one and writes in place, so a
    run killed during a save with ``max_keep_ckpts=1`` keeps no complete checkpoint. Here:

    * a checkpoint is written to ``<name>.tmp``, flushed to disk and renamed: it is complete or
      absent under its own name (a sharded one, a folder of per-process parts, is renamed once
      every process has written its part); ``last_checkpoint`` is rewritten the same way;
    * the checkpoint beyond ``max_keep_ckpts`` is deleted only after the new one is complete;
    * ``.tmp`` files and folders a killed save left in the checkpoint folder are removed when
      training (re)starts;
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
                _remove(osp.join(self.out_dir, name))
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
            # every process has written its part (a sharded checkpoint: one file each in the
            # folder) before the main one renames it; else a slower part lands in a new .tmp
            barrier()
            if not is_main_process():
                return
            _commit(self.last_ckpt + _TMP, self.last_ckpt)
            _write_text_atomically(osp.join(runner.work_dir, 'last_checkpoint'), self.last_ckpt)
        except OSError as e:  # last_checkpoint still names the previous complete checkpoint
            if osp.exists(self.last_ckpt + _TMP):
                _remove(self.last_ckpt + _TMP)
            raise _write_failed(self.last_ckpt, e, _previous_checkpoint(runner.work_dir)) from e
        if stale is not None:
            old = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(stale))
            if self.file_backend.isfile(old):
                self.file_backend.remove(old)
            elif self.file_backend.isdir(old):  # checkpoints saved by deepspeed are folders
                self.file_backend.rmtree(old)
