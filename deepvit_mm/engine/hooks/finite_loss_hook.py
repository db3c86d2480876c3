"""``FiniteLossHook``: training stops at the first iteration whose loss is not finite.

In a config::

    custom_hooks = [dict(type='FiniteLossHook')]
"""
import os.path as osp

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

__all__ = ['FiniteLossHook']


@HOOKS.register_module()
class FiniteLossHook(Hook):
    """Stop training at the first iteration whose loss is NaN or infinite.

    A diverged run otherwise trains to the end on ``loss: nan``, overwrites its good checkpoints
    with NaN weights and exits 0. This runs before the logger and checkpoint hooks, so the
    iteration that diverged is not saved. Once a loss is not finite, it also passes the batch
    through the data preprocessor again and names NaN or infinite images (the backbones read
    their input's values on their first call only: on a GPU that reading waits for the device).
    (mmdet's ``CheckInvalidLossHook`` checks every 50 iterations with an ``assert``, and mmseg has
    none.)
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
            + ', '.join(f'{k}={v}' for k, v in bad.items()) + '). '
            + _input_problem(runner.model, data_batch) + 'Check the learning rate and its '
            'warm-up (optim_wrapper.optimizer.lr, param_scheduler), gradient clipping '
            '(optim_wrapper.clip_grad), mixed precision (--amp), the loss weights, and the '
            'annotations (empty or degenerate boxes). '
            + (f'The last complete checkpoint is {last}: fix the cause, then resume with --resume.'
               if last else 'No checkpoint was saved before it.'))


def _input_problem(model, data_batch) -> str:
    """A sentence naming the NaN or infinite values of the batch as the model takes it (after its
    data preprocessor), or ''."""
    from mmengine.model import is_model_wrapper
    model = model.module if is_model_wrapper(model) else model
    preprocessor = getattr(model, 'data_preprocessor', None)
    if not data_batch or preprocessor is None:
        return ''
    with torch.no_grad():
        inputs = preprocessor(data_batch, True)['inputs']
    inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    bad = sum(int((~torch.isfinite(x)).sum()) for x in inputs
              if torch.is_tensor(x) and x.is_floating_point())
    if not bad:
        return ''
    return (f'The images hold {bad} NaN or infinite values after the data preprocessor: check its '
            'mean and std (a std of 0) and the image files. ')
