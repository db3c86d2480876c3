"""ViTDet's windowed attention (Li et al., "Exploring Plain Vision Transformer Backbones for Object
Detection", ECCV 2022), for any timm attention: CaiT's talking heads, ViT's.

ViTDet keeps a few blocks global and lets the others attend within non-overlapping ``k x k``
windows of the patch grid, the grid zero-padded at the bottom/right to a multiple of the window;
the padding tokens take part in the attention of their window, and a grid that fits in one window
is attended globally, without padding.

The tokens go through the blocks as a ``(B, H, W, C)`` grid (``forward_grid``): a block's norms,
MLP, LayerScale and stochastic depth act on the last axis or per sample and take it as they take
``(B, N, C)``, and its attention (``GridAttention``, timm's attention class with the grid added)
reads the grid from its input's shape, cuts it into windows with timm's ``window_partition`` /
``window_unpartition`` (SAM's ViTDet helpers) and runs timm's own attention on them: the attention
math is never copied, and the parameters and state-dict keys are timm's.
"""
import dataclasses
from typing import Callable, Iterable, Iterator, List, Sequence, Tuple

import torch
import torch.nn as nn
from timm.models.vision_transformer_sam import window_partition, window_unpartition

__all__ = ['GridAttention', 'WindowArgs', 'Windowed']


def attend_in_windows(attend: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                      window_size: int) -> torch.Tensor:
    """``attend`` (tokens ``(b, n, C)`` to ``(b, n, C)``) over a ``(B, H, W, C)`` grid: globally
    (``window_size`` 0, or a grid within one window) or within ``window_size`` windows.

    Returns:
        Tensor: ``(B, H, W, C)``.
    """
    B, H, W, C = x.shape
    ws = window_size
    if not ws or (H <= ws and W <= ws):
        return attend(x.reshape(B, H * W, C)).reshape(B, H, W, C)
    windows, pad_hw = window_partition(x, ws)  # (B * nW, ws, ws, C)
    out = attend(windows.reshape(-1, ws * ws, C))
    return window_unpartition(out.reshape(-1, ws, ws, C), ws, (H, W), pad_hw)


class GridAttention(nn.Module):
    """The grid for a timm attention class: ``class X(GridAttention, TimmAttention)``.

    ``forward`` takes a ``(B, H, W, C)`` grid (attended in ``window_size`` windows, or globally
    where ``window_size`` is 0) or ``(B, N, C)`` tokens (exactly timm's attention). ``_attend`` is
    the attention on tokens: timm's ``forward``, unless the class says otherwise.

    Attributes:
        window_size (int): Patches a window side; 0 for global attention.
    """
    window_size: int = 0

    def _attend(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return super().forward(x, *args, **kwargs)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """Args:
            x (Tensor): ``(B, H, W, C)`` grid of tokens, or ``(B, N, C)`` tokens.
            args, kwargs: The timm attention's own arguments (ViT's ``attn_mask``).

        Returns:
            Tensor: same shape as ``x``.
        """
        if x.dim() == 3:
            return self._attend(x, *args, **kwargs)
        return attend_in_windows(lambda t: self._attend(t, *args, **kwargs), x, self.window_size)

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}' if self.window_size else 'global'


def forward_grid(blocks: Iterable[nn.Module], x: torch.Tensor,
                 checkpointing: bool) -> Iterator[torch.Tensor]:
    """Run ``blocks`` on a ``(B, H, W, C)`` token grid, yielding each block's output before the
    next block runs. ``checkpointing``: each block under non-reentrant activation checkpointing
    (timm's choice), where gradients are wanted."""
    checkpointing = checkpointing and torch.is_grad_enabled()
    for blk in blocks:
        if checkpointing:
            x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
        else:
            x = blk(x)
        yield x


def check_windows(name: str, arch: str, window_size, global_blocks, kept_blocks: int,
                  default: Sequence[int]) -> Tuple[int, Tuple[int, ...]]:
    """The windows of a backbone: ``window_size`` 0 or a positive int; ``global_blocks`` only with
    windows, strictly increasing 0-based indices of the ``kept_blocks`` built blocks; else
    ``ValueError`` saying what to pass.

    Args:
        name (str): The backbone's class name; ``arch`` its arch, for the messages.
        window_size, global_blocks: As given to the backbone.
        kept_blocks (int): Blocks the trunk keeps.
        default (Sequence[int]): The family's global blocks when ``global_blocks`` is None.

    Returns:
        tuple: ``window_size`` and the blocks with global attention (every block without windows).
    """
    if not isinstance(window_size, int) or isinstance(window_size, bool) or window_size < 0:
        raise ValueError(f'{name}: window_size={window_size!r} must be 0 (global attention) or a '
                         'positive number of patches, e.g. 14.')
    if not window_size:
        if global_blocks is not None:
            raise ValueError(f'{name}: global_blocks={tuple(global_blocks)} needs window_size > 0 '
                             '(without windows every block is global).')
        return 0, tuple(range(kept_blocks))
    if global_blocks is None:
        return window_size, tuple(default)
    idx = tuple(int(i) for i in global_blocks)
    if any(i < 0 or i >= kept_blocks for i in idx) or list(idx) != sorted(set(idx)):
        raise ValueError(f'{name}({arch}): global_blocks {tuple(global_blocks)} must be strictly '
                         f'increasing 0-based block indices in [0, {kept_blocks - 1}] (the '
                         f'default is {tuple(default)}).')
    return window_size, idx


@dataclasses.dataclass(frozen=True)
class WindowArgs:
    """The windows of a backbone, checked (``check_windows``): a windowed family's own arguments
    (``ColumnarArgs.family``), or the first of them.

    Attributes:
        window_size (int): 0 (global attention) or the side of the windows, in patches.
        global_blocks (tuple[int]): The 0-based blocks with global attention (every block
            without windows).
    """
    window_size: int
    global_blocks: Tuple[int, ...]

    def window_of(self, block: int) -> int:
        """The window side of the 0-based ``block``: 0 where it attends globally."""
        return 0 if block in self.global_blocks else self.window_size


class Windowed:
    """Mixin of a ``ColumnarBackbone`` family with ViTDet's windows (CaiT, TimmViT), whose own
    arguments (``args.family``) are a ``WindowArgs``: its ``window_size`` and ``global_blocks``,
    and the taps of its trunk's blocks run on a token grid (``_grid_taps``)."""

    @property
    def window_size(self) -> int:
        """0 (global attention) or the side of the windows of every block but ``global_blocks``."""
        return self.args.family.window_size

    @property
    def global_blocks(self) -> Tuple[int, ...]:
        """The 0-based blocks with global attention."""
        return self.args.family.global_blocks

    def _grid_taps(self, x: torch.Tensor, as_blocks_end: bool = False) -> List[torch.Tensor]:
        """The outputs of blocks ``out_indices`` of the trunk run on the ``(B, h, w, C)`` token
        grid ``x`` (``forward_grid``, timm's ``grad_checkpointing``), as ``(B, C, h, w)`` maps.

        Args:
            x (Tensor): The token grid the first block takes.
            as_blocks_end (bool): Make each map as its block ends (CaiT's order), not once every
                block has run (timm's ``forward_intermediates``, TimmViT's): the order in which
                autograd sums a block output's gradients, hence their rounding, follows it.
        """
        def to_map(y: torch.Tensor) -> torch.Tensor:
            return y.permute(0, 3, 1, 2).contiguous()

        trunk, take, taps = self.trunk, set(self.out_indices), []
        for i, y in enumerate(forward_grid(trunk.blocks, x, trunk.grad_checkpointing)):
            if i in take:
                taps.append(to_map(y) if as_blocks_end else y)
        return taps if as_blocks_end else [to_map(y) for y in taps]
