"""timm's ViT attention within windows of the patch grid (ViTDet, Li et al., ECCV 2022).

ViTDet keeps a few blocks of a plain ViT global (by default 2, 5, 8 and 11 of 12) and lets the
others attend within non-overlapping ``k x k`` windows (14: the pretraining grid), the grid
zero-padded at the bottom/right to a multiple of the window.

``WindowedAttention`` is timm's ``Attention`` (the same parameters and state-dict keys: every ViT
checkpoint loads unchanged) whose ``forward`` cuts the ``(B, h * w, C)`` patch tokens into windows
with timm's ``window_partition`` / ``window_unpartition`` (SAM's ViTDet helpers) and runs timm's
own attention on them; the attention math is never copied. timm's blocks call their attention
with tokens only, so the backbone tells each windowed attention the patch grid (``grid``) before
a forward. Windows need a trunk without class or register tokens (ViTDet drops the pretrained
class token), which ``TimmViT`` builds when ``window_size > 0``.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from timm.models.vision_transformer import Attention
from timm.models.vision_transformer_sam import window_partition, window_unpartition

__all__ = ['WindowedAttention', 'use_windows']


class WindowedAttention(Attention):
    """timm's ``Attention`` within ``window_size x window_size`` windows of a patch grid.

    Built from a timm ``Attention`` by ``use_windows`` (its parameters kept). A grid that fits in
    one window is attended globally, without padding.

    Attributes:
        window_size (int): Patches a window side.
        grid (tuple[int, int] | None): The patch grid ``(h, w)`` of the next forward.
    """
    window_size: int
    grid: Optional[Tuple[int, int]]

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """Args:
            x (Tensor): ``(B, h * w, C)`` patch tokens of the grid ``self.grid``.
            args, kwargs: timm's ``Attention.forward`` arguments (``attn_mask``).

        Returns:
            Tensor: ``(B, h * w, C)``.
        """
        if self.grid is None:
            raise RuntimeError('WindowedAttention: the patch grid is unset; the backbone sets it '
                               'before each forward (TimmViT(window_size=...)).')
        h, w = self.grid
        ws = self.window_size
        B, N, C = x.shape
        if h <= ws and w <= ws:
            return super().forward(x, *args, **kwargs)
        windows, pad_hw = window_partition(x.reshape(B, h, w, C), ws)  # (B * nW, ws, ws, C)
        out = super().forward(windows.reshape(-1, ws * ws, C), *args, **kwargs)
        return window_unpartition(out.reshape(-1, ws, ws, C), ws, (h, w), pad_hw).reshape(B, N, C)

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}'


def use_windows(attn: nn.Module, window_size: int) -> WindowedAttention:
    """Make timm's ``attn`` (an ``Attention``, not a subclass) attend within windows, in place.

    Args:
        attn (nn.Module): A block's ``attn``.
        window_size (int): Patches a window side, > 0.

    Returns:
        WindowedAttention: ``attn`` itself, its class changed (its parameters, buffers and keys
        unchanged).

    Raises:
        TypeError: ``attn`` is another attention than timm's ``Attention``.
    """
    if type(attn) is not Attention:
        raise TypeError(f'window attention takes timm\'s vision_transformer.Attention, got '
                        f'{type(attn).__name__}: this model has another attention; use '
                        'window_size=0.')
    attn.__class__ = WindowedAttention
    attn.window_size = window_size
    attn.grid = None
    return attn
