"""Sharded training (FSDP) through mmengine's ``FlexibleRunner`` and ``FSDPStrategy``.

Under DDP every process holds the whole model state: weights, gradients and AdamW's two moments,
16 bytes a parameter in float32. ``FSDPStrategy`` shards it over the processes (each holds 1/N and
gathers a unit's weights only while that unit runs). What this module adds to mmengine's:

* ``columnar_block_policy`` (registered in mmengine's ``FUNCTIONS``): the auto-wrap policy that
  makes every trunk block of an XCiT or CaiT backbone one FSDP unit (the families' ``block_type``);
  the rest of the detector or segmentor (patch embedding, ``ColumnarPyramid``, neck, heads) is the
  root unit.
* ``GlobalNormFSDPStrategy`` (registered in ``STRATEGIES``): mmengine's ``FSDPStrategy`` whose
  gradient clipping by norm takes the norm of the whole gradient. mmengine's ``OptimWrapper``
  clips with ``torch.nn.utils.clip_grad_norm_`` over the parameters it holds, which under FSDP are
  this process's shards: each process clipped by its own shard's norm (the demo detector on 2
  processes: 28.35 where the whole gradient's is 31.59), and training drifted from what DDP
  trains. Here it clips through ``FullyShardedDataParallel.clip_grad_norm_``, whose norm is
  reduced over the processes.
  It also resumes: mmengine 0.10.7 passes ``FSDP.optim_state_dict_to_load`` its arguments in
  torch 2.0's order, which torch 2.1 changed (``TypeError: unhashable type: 'dict'`` at
  ``--resume``); here they go by name.
* ``CPUFullyShardedDataParallel`` (registered in ``MODEL_WRAPPERS``): mmengine's
  ``MMFullyShardedDataParallel`` on CPU processes. mmengine's ``FSDPStrategy`` passes
  ``device_id=LOCAL_RANK``, a GPU index; ``setup_cpu_distributed`` selects this wrapper on a
  machine without CUDA (gloo), as it selects ``CPUDistributedDataParallel`` for DDP, and like
  that one it reverts SyncBN (no CPU implementation) to BN.

``configs/_base_/fsdp.py`` turns a recipe into a sharded run (docs/training.md).
"""
from typing import Optional

import torch
import torch.nn as nn
from mmengine.model.wrappers import MMFullyShardedDataParallel
from mmengine.optim import OptimWrapperDict
from mmengine.registry import FUNCTIONS, MODEL_WRAPPERS, STRATEGIES
from torch.distributed.fsdp import FullyShardedDataParallel

from ...compat.mmengine import FSDPStrategy
from ...models.backbones.columnar import ColumnarBackbone
from .ddp import without_sync_batchnorm

__all__ = ['columnar_block_policy', 'GlobalNormFSDPStrategy', 'CPUFullyShardedDataParallel']


def columnar_block_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int = 0) -> bool:
    """FSDP auto-wrap policy: one unit per trunk block of the XCiT and CaiT backbones.

    Args:
        module (nn.Module): The module FSDP asks about.
        recurse (bool): True: whether to look into its children (always); False: whether to
            make it a unit.
        nonwrapped_numel (int): Parameters not yet in a unit below it (unused).
    """
    if recurse:
        return True
    types = tuple(f.block_type for f in ColumnarBackbone.families if f.block_type is not None)
    return isinstance(module, types)


FUNCTIONS.register_module(name='columnar_block_policy', module=columnar_block_policy)


@STRATEGIES.register_module()
class GlobalNormFSDPStrategy(FSDPStrategy):
    """mmengine's ``FSDPStrategy`` (same arguments) whose gradient clipping by norm
    (``optim_wrapper.clip_grad=dict(max_norm=...)``) clips by the norm of the whole gradient, as
    DDP does, instead of each process's shard's, and which resumes on torch >= 2.1 (module
    docstring)."""

    def build_optim_wrapper(self, optim_wrapper, model: Optional[nn.Module] = None):
        built = super().build_optim_wrapper(optim_wrapper, model)
        fsdp = model if model is not None else self.model
        wrappers = built.values() if isinstance(built, OptimWrapperDict) else [built]
        for wrapper in wrappers:
            if getattr(wrapper, 'clip_grad_kwargs', None) and wrapper.grad_name == 'grad_norm':
                wrapper.clip_func = _global_norm_clip(fsdp)
        return built

    def load_optim_state_dict(self, state_dict: dict) -> None:
        """Load a whole (``full``) optimizer state: its parts go to the processes holding them."""
        optim_state_dict = FullyShardedDataParallel.optim_state_dict_to_load(
            model=self.model, optim=self.optim_wrapper.optimizer, optim_state_dict=state_dict)
        self.optim_wrapper.load_state_dict(optim_state_dict)


def _global_norm_clip(fsdp: nn.Module):
    def clip(params, max_norm: float, norm_type: float = 2.0, **kwargs) -> torch.Tensor:
        return fsdp.clip_grad_norm_(max_norm, norm_type)  # all of the root's gradients
    return clip


@MODEL_WRAPPERS.register_module()
class CPUFullyShardedDataParallel(MMFullyShardedDataParallel):
    """``MMFullyShardedDataParallel`` for a model on CPU processes (gloo).

    Args:
        module (nn.Module): The model, on CPU.
        device_id (int, optional): Ignored: mmengine's ``FSDPStrategy`` passes ``LOCAL_RANK``, a
            GPU index; the shards stay on the CPU.
        kwargs: ``MMFullyShardedDataParallel`` arguments (``auto_wrap_policy``,
            ``sharding_strategy``, ``use_orig_params``, ...).
    """

    def __init__(self, module: nn.Module, device_id: Optional[int] = None, **kwargs) -> None:
        super().__init__(without_sync_batchnorm(module), device_id=torch.device('cpu'), **kwargs)
