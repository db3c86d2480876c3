"""What differs between the timm releases the backbones build on (1.0.16 to 1.0.x, tested: 1.0.16
and 1.0.31), each with the release that changed it.

* ``drop_path_of``: timm 1.0.21 gave each residual of an XCA block its own stochastic depth
  (``drop_path1..3``); earlier releases share one ``drop_path``.
* ``drop_pruned_classifier_parameters``: ``prune_intermediate_layers(prune_head=True)`` keeps the
  class token before timm 1.0.31.
* ``create_model``: timm 1.0.16's ViT, EVA and BEiT read their stochastic-depth rates with
  ``.item()`` from ``torch.linspace`` on the default device, which fails on the meta device (a
  model built there for its structure); 1.0.31 asks for the CPU itself.
"""
from typing import Iterable

import timm
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

__all__ = ['create_model']


def drop_path_of(block: nn.Module, i: int) -> nn.Module:
    """The stochastic depth of the ``i``-th residual (1, 2, 3) of a timm ``XCABlock``."""
    return getattr(block, f'drop_path{i}', None) or block.drop_path


def drop_pruned_classifier_parameters(trunk: nn.Module, parts: Iterable[str]) -> None:
    """Set to None the classification parameters among ``parts`` (``cls_token``) that a pruned
    trunk still holds: a parameter that never gets a gradient (DDP without
    ``find_unused_parameters`` stops on it)."""
    for part in parts:
        if isinstance(getattr(trunk, part, None), nn.Parameter):
            setattr(trunk, part, None)


class _LinspaceOnCPU(TorchFunctionMode):
    """``torch.linspace`` without a device runs on the CPU (inside ``torch.device('meta')``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.linspace and kwargs.get('device') is None:
            kwargs = dict(kwargs, device='cpu')
        return func(*args, **kwargs)


def create_model(name: str, **kwargs) -> nn.Module:
    """``timm.create_model(name, **kwargs)``, also under ``torch.device('meta')`` with timm 1.0.16
    (there its drop-path rates are read from a ``linspace`` made on the CPU; elsewhere no torch
    function is intercepted, which would slow every initialisation call)."""
    if not torch.empty(()).is_meta:
        return timm.create_model(name, **kwargs)
    with _LinspaceOnCPU():
        return timm.create_model(name, **kwargs)
