"""Helpers that the checkpoints, the models and the engine all need, below each of them.

``unwrap_model``: the model that mmengine's wrappers hold. ``meta_device``: build modules for
their structure only."""
import contextlib
from typing import Iterator

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

__all__ = ['unwrap_model', 'meta_device']


def unwrap_model(module: nn.Module) -> nn.Module:
    """The detector or segmentor inside mmengine's model wrappers (``MMDistributedDataParallel``,
    ...) and test-time augmentation models (``BaseTTAModel``), as mmengine holds it."""
    from mmengine.model import BaseTTAModel, is_model_wrapper
    while is_model_wrapper(module) or isinstance(module, BaseTTAModel):
        module = module.module
    return module


# In-place operations of weight initialisation (torch.nn.init's, timm's trunc_normal_): on meta
# tensors they compute nothing and change no shape, yet several of them (clamp_, erfinv_) run as
# Python meta functions, milliseconds a call: most of a large model's build on the meta device.
_INIT_OPS = frozenset({
    'uniform_', 'normal_', 'trunc_normal_', 'erfinv_', 'clamp_', 'clamp_min_', 'clamp_max_',
    'mul_', 'add_', 'sub_', 'div_', 'fill_', 'zero_', 'copy_', 'exponential_', 'log_normal_',
    'bernoulli_', 'random_', 'sqrt_', 'exp_', 'neg_', 'abs_'})


class _SkipInitOnMeta(TorchFunctionMode):
    """Initialisation's in-place operations on meta tensors return their tensor untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if (getattr(func, '__name__', None) in _INIT_OPS and args
                and isinstance(args[0], torch.Tensor) and args[0].is_meta):
            return args[0]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def meta_device() -> Iterator[None]:
    """``torch.device('meta')`` for building modules for their structure (shapes, parameter
    counts, FLOPs): no memory, and initialisation's in-place operations skipped."""
    with torch.device('meta'), _SkipInitOnMeta():
        yield
