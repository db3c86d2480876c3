"""Per-block gradient checkpointing of a timm trunk, BatchNorm statistics updated once.

timm's models checkpoint every block themselves once ``set_grad_checkpointing(True)`` is called
(``forward_features`` and ``forward_intermediates`` both honour it): a block's activations are
not kept but recomputed from its input in the backward pass. A BatchNorm inside a block (XCiT's
local patch interaction) is then run twice per step in training mode, and its running statistics
take two momentum steps instead of one: eval-time statistics drift from those of a run without
checkpointing, though outputs and gradients are identical. Here the buffers of a block's
BatchNorms are copied before the recomputation runs the block again and put back after it; the
recomputation itself is left untouched (same batch statistics, same saved tensors, which
non-reentrant checkpointing verifies), so outputs and gradients are unchanged. This needs each
recomputation to run its block to the end (``full_recomputation``): by default non-reentrant
checkpointing stops a recomputation as soon as the tensors the backward needs are back, and a
block stopped early would skip the restore.
"""
from contextlib import nullcontext
from typing import ContextManager

import torch
import torch.nn as nn

from ..layers import BatchNormBase

__all__ = []


def _in_backward() -> bool:
    """Whether autograd's backward pass is running (a checkpointed block being recomputed)."""
    # reason: the only time a module runs forward while a graph task executes; torch.utils.
    # checkpoint tells its recomputation apart by the same private call (torch 2.1 to 2.14)
    return torch._C._current_graph_task_id() != -1


def _save_stats_on_recompute(block: nn.Module, args) -> None:
    if block.training and _in_backward():
        block._deepvit_mm_stats = [
            (bn, [b.clone() for b in bn.buffers(recurse=False)]) for bn in block.modules()
            if isinstance(bn, BatchNormBase) and bn.training and bn.track_running_stats]


def _restore_stats(block: nn.Module, args, output) -> None:
    saved = block.__dict__.pop('_deepvit_mm_stats', None)
    with torch.no_grad():
        for bn, buffers in saved or ():
            for b, s in zip(bn.buffers(recurse=False), buffers):
                b.copy_(s)


def enable_grad_checkpointing(trunk: nn.Module) -> None:
    """Turn on timm's per-block checkpointing of ``trunk`` (a timm model with ``blocks``) and
    keep the BatchNorms of its blocks from updating their statistics a second time.

    The hooks sit on the blocks, not on their BatchNorms, so they still act after mmengine
    replaces the BatchNorms (``revert_sync_batchnorm`` in single-process runs).

    Args:
        trunk (nn.Module): A timm model with ``set_grad_checkpointing`` and ``blocks``.
    """
    trunk.set_grad_checkpointing(True)
    for block in trunk.blocks:
        if any(isinstance(m, BatchNormBase) for m in block.modules()):
            block.register_forward_pre_hook(_save_stats_on_recompute)
            block.register_forward_hook(_restore_stats)


def full_recomputation(enabled: bool) -> ContextManager:
    """Context for the forward pass of a checkpointed trunk: recomputations run whole blocks
    (``torch.utils.checkpoint.set_checkpoint_early_stop(False)``, needed only while the forward
    runs). A no-op when ``enabled`` is False.

    Args:
        enabled (bool): Whether the trunk is checkpointed.
    """
    return torch.utils.checkpoint.set_checkpoint_early_stop(False) if enabled else nullcontext()
