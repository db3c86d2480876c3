"""Sharded training (FSDP) through mmengine's ``FlexibleRunner`` and ``FSDPStrategy``.

Under DDP every process holds the whole model state: weights, gradients and AdamW's two moments,
16 bytes a parameter in float32. ``FSDPStrategy`` shards it over the processes (each holds 1/N and
gathers a unit's weights only while that unit runs). What this module adds to mmengine's:

* ``columnar_block_policy`` (registered in mmengine's ``FUNCTIONS``): the auto-wrap policy that
  makes every trunk block of a deepvit_mm backbone one FSDP unit (the families' ``block_type``);
  the rest of the detector or segmentor (patch embedding, ``ColumnarPyramid``, neck, heads) is the
  root unit.
* ``GlobalNormFSDPStrategy`` (registered in ``STRATEGIES``): mmengine's ``FSDPStrategy`` whose
  gradient clipping by norm computes what DDP computes, bit for bit. mmengine's ``OptimWrapper``
  clips with ``torch.nn.utils.clip_grad_norm_`` over the parameters it holds, which under FSDP are
  this process's shards: each process clipped by its own shard's norm. FSDP's own
  ``clip_grad_norm_`` takes the whole gradient's norm, but sums it in another order (each
  process's pieces, then across processes), so its coefficient differs from DDP's in the last
  bits, and a detector amplifies that: its RPN and RoI sampler take other boxes on any rounding
  change (docs/training.md has the figures). Here each parameter's norm is computed over its whole
  gradient by one process (the pieces of a parameter split between processes are sent to the one
  holding its largest piece), the norms are shared exactly (an all-reduce in which every entry
  has one non-zero term) and summed as ``clip_grad_norm_`` sums them, in the optimizer's order;
  every process then scales its shards by that coefficient.
  It also resumes: mmengine 0.10.7 passes ``FSDP.optim_state_dict_to_load`` its arguments in
  torch 2.0's order, which torch 2.1 changed (``TypeError: unhashable type: 'dict'`` at
  ``--resume``); here they go by name.
* ``CPUFullyShardedDataParallel`` (registered in ``MODEL_WRAPPERS``): mmengine's
  ``MMFullyShardedDataParallel`` on CPU processes. mmengine's ``FSDPStrategy`` passes
  ``device_id=LOCAL_RANK``, a GPU index; ``setup_cpu_distributed`` selects this wrapper on a
  machine without CUDA (gloo), as it selects ``CPUDistributedDataParallel`` for DDP, and like
  that one it reverts SyncBN (no CPU implementation) to BN.

``configs/_base_/fsdp.py`` turns a recipe into a sharded run (docs/training.md).

FSDP internals read, as FSDP's own ``clip_grad_norm_`` reads them (tested on torch 2.14): the
root's ``_all_handles`` and ``compute_device``, a handle's ``uses_sharded_strategy``,
``_use_orig_params`` and ``flat_param._params`` (which parameters are sharded); torch's
``_group_tensors_by_device_and_dtype`` (the order in which ``clip_grad_norm_`` sums the norms).
"""
from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine._strategy import FSDPStrategy  # exported from this private module only (0.10.x)
from mmengine.model.wrappers import MMFullyShardedDataParallel
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import FUNCTIONS, MODEL_WRAPPERS, STRATEGIES
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from ...models.backbones.columnar import ColumnarBackbone
from .ddp import without_sync_batchnorm

__all__ = ['columnar_block_policy', 'GlobalNormFSDPStrategy', 'CPUFullyShardedDataParallel']


def columnar_block_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int = 0) -> bool:
    """FSDP auto-wrap policy: one unit per trunk block of every deepvit_mm backbone.

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
    (``optim_wrapper.clip_grad=dict(max_norm=...)``) computes DDP's norm and coefficient, bit for
    bit, instead of each process's shard's, and which resumes on torch >= 2.1 (module
    docstring)."""

    def build_optim_wrapper(self, optim_wrapper, model: Optional[nn.Module] = None):
        built = super().build_optim_wrapper(optim_wrapper, model)
        fsdp = model if model is not None else self.model
        wrappers = built.values() if isinstance(built, OptimWrapperDict) else [built]
        for wrapper in wrappers:
            if getattr(wrapper, 'clip_grad_kwargs', None) and wrapper.grad_name == 'grad_norm':
                wrapper.clip_func = DDPNormClip(fsdp, wrapper)
        return built

    def load_optim_state_dict(self, state_dict: dict) -> None:
        """Load a whole (``full``) optimizer state: its parts go to the processes holding them."""
        optim_state_dict = FullyShardedDataParallel.optim_state_dict_to_load(
            model=self.model, optim=self.optim_wrapper.optimizer, optim_state_dict=state_dict)
        self.optim_wrapper.load_state_dict(optim_state_dict)


class DDPNormClip:
    """``clip_func`` of an ``OptimWrapper`` of a sharded model: ``torch.nn.utils.clip_grad_norm_``
    over the optimizer's parameters as DDP runs it, whose total norm, coefficient and clipped
    gradients are those DDP computes from the same gradients, bit for bit.

    The norm of each parameter's gradient is computed whole, by one process: the one holding all of
    it, or, for a parameter split between processes at a shard's edge, the one holding its largest
    piece, to which the others send theirs (one ``all_to_all``: at most the two pieces at the ends
    of each process's shard of an FSDP unit). The norms travel in an all-reduce where each entry
    has one non-zero term (exact), and are summed in the optimizer's order, as
    ``clip_grad_norm_`` sums them. Parameters FSDP does not shard (``NO_SHARD`` units, modules FSDP
    ignores) have their whole gradient on every process: the first process computes their norms.
    Without ``use_orig_params`` the optimizer holds FSDP's flat parameters, which DDP has not:
    FSDP's own ``clip_grad_norm_`` clips then.

    Args:
        fsdp (FullyShardedDataParallel): The root FSDP module.
        wrapper (OptimWrapper): The optimizer wrapper whose parameters it clips.
    """

    def __init__(self, fsdp: FullyShardedDataParallel, wrapper: OptimWrapper) -> None:
        self.fsdp, self.wrapper = fsdp, wrapper

    def __call__(self, params, max_norm: float, norm_type: float = 2.0,
                 error_if_nonfinite: bool = False, foreach: Optional[bool] = None) -> torch.Tensor:
        # mmengine hands the parameters with a gradient on this process: under FSDP, this
        # process's pieces. DDP's are the optimizer's parameters with a gradient on any process.
        params = [p for g in self.wrapper.optimizer.param_groups for p in g['params']
                  if p.requires_grad]
        handles = self.fsdp._all_handles
        if any(h.uses_sharded_strategy and not h._use_orig_params for h in handles):
            return self.fsdp.clip_grad_norm_(max_norm, norm_type)
        sharded = {id(p) for h in handles if h.uses_sharded_strategy for p in h.flat_param._params}
        if not sharded:  # every gradient whole on every process, as under DDP
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type,
                                                  error_if_nonfinite=error_if_nonfinite,
                                                  foreach=foreach)
        norms = _whole_gradient_norms(params, sharded, self.fsdp.process_group, norm_type,
                                      foreach, self.fsdp.compute_device)
        if not norms:
            return torch.tensor(0.0)
        # torch.nn.utils.clip_grad_norm_'s sum of the norms and its scaling, as DDP runs it
        grouped = _group_tensors_by_device_and_dtype([norms])
        ordered = [n for (_, _), ([group], _) in grouped.items() for n in group]
        total = torch.linalg.vector_norm(
            torch.stack([n.to(norms[0].device) for n in ordered]), norm_type)
        if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
            raise RuntimeError(
                f'The total norm of order {norm_type} for gradients from `parameters` is '
                'non-finite, so it cannot be clipped. To disable this error and scale the '
                'gradients by the non-finite norm anyway, set `error_if_nonfinite=False`')
        clip_coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(clip_coef.to(p.grad.device))
        return total


def _whole_gradient_norms(params: List[nn.Parameter], sharded: set, group, norm_type: float,
                          foreach: Optional[bool], device: torch.device) -> List[torch.Tensor]:
    """The norm of each whole gradient of ``params`` (those with a gradient on any process, in
    their order), on every process of ``group``: ``DDPNormClip``'s exchange."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    pieces = [p.grad.reshape(-1) if p.grad is not None else None for p in params]
    sizes = torch.tensor([-1 if g is None else g.numel() for g in pieces], device=device)
    every = [torch.empty_like(sizes) for _ in range(world)]
    dist.all_gather(every, sizes, group=group)
    held = torch.stack(every).tolist()  # [process][parameter]: the size of its piece, -1: none
    owner = {}
    for i, p in enumerate(params):
        holders = [r for r in range(world) if held[r][i] >= 0]
        if holders:  # else no gradient anywhere: clip_grad_norm_ leaves it out
            owner[i] = (max(holders, key=lambda r: (held[r][i], -r)) if id(p) in sharded
                        else holders[0])
    split = [i for i in owner if id(params[i]) in sharded
             and sum(held[r][i] >= 0 for r in range(world)) > 1]
    received = {}
    if split:  # the pieces of split parameters go to their owners
        dtype = _common_dtype([params[i] for i in split])
        send = [[pieces[i] for i in split if owner[i] == d and d != rank and pieces[i] is not None]
                for d in range(world)]
        recv = [[i for i in split if owner[i] == rank and s != rank and held[s][i] >= 0]
                for s in range(world)]
        recv_sizes = [sum(held[s][i] for i in recv[s]) for s in range(world)]
        out = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
        flat = [t.to(device, dtype) for d in send for t in d]
        dist.all_to_all_single(
            out, torch.cat(flat) if flat else torch.empty(0, dtype=dtype, device=device),
            recv_sizes, [sum(t.numel() for t in d) for d in send], group=group)
        chunks = iter(out.split([held[s][i] for s in range(world) for i in recv[s]]))
        for s in range(world):
            for i in recv[s]:
                received[i, s] = next(chunks)
    mine = [i for i, o in owner.items() if o == rank]
    whole = []
    for i in mine:  # the gradient of parameter i, whole and flat, in the processes' order
        parts = [pieces[i] if s == rank else received[i, s].to(pieces[i].dtype)
                 for s in range(world) if (i, s) in received or s == rank]
        whole.append(parts[0] if len(parts) == 1 else torch.cat(parts))
    if whole:
        local = (torch._foreach_norm(whole, norm_type) if foreach is not False
                 else [torch.linalg.vector_norm(g, norm_type) for g in whole])
    else:
        local = []
    shared = torch.zeros(len(params), dtype=torch.float64, device=device)
    for i, n in zip(mine, local):
        shared[i] = n.to(device, torch.float64)  # exact: a float32 or narrower norm
    dist.all_reduce(shared, group=group)  # one non-zero term per entry: exact
    return [shared[i].to(params[i].device, params[i].dtype) for i in owner]


def _common_dtype(params: List[nn.Parameter]) -> torch.dtype:
    dtype = params[0].dtype
    for p in params[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    return dtype


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
