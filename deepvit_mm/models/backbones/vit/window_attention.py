"""timm's ViT attention on a token grid, global or within ViTDet's windows (``..windows``).

``WindowedAttention`` is timm's ``Attention`` (the same parameters and state-dict keys: every ViT
checkpoint loads unchanged) with ``..windows.GridAttention``'s grid. ``use_windows`` turns a built
block's attention into one, in place (``..adapt``). Windows need a trunk without class or register tokens
(ViTDet drops the pretrained class token), which ``TimmViT`` builds when ``window_size > 0``; its
tokens then go through the blocks as a grid (``..windows.forward_grid``).
"""
import torch.nn as nn
from timm.models.vision_transformer import Attention

from ..adapt import adapt
from ..windows import GridAttention

__all__ = []


class WindowedAttention(GridAttention, Attention):
    """timm's ``Attention`` over a ``(B, H, W, C)`` token grid, within ``window_size`` windows
    (0: globally); on ``(B, N, C)`` tokens, timm's attention. Made by ``use_windows``."""


def use_windows(attn: nn.Module, window_size: int) -> WindowedAttention:
    """Make timm's ``attn`` (an ``Attention``, not a subclass) take a token grid, in place.

    Args:
        attn (nn.Module): A block's ``attn``.
        window_size (int): Patches a window side; 0 for global attention.

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
    return adapt(attn, WindowedAttention, window_size=window_size)
