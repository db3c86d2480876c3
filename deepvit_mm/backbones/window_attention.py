"""timm's talking-heads attention on a token grid: global, or within windows (ViTDet style).

CaiT's self-attention (Touvron et al., "Going deeper with Image Transformers", ICCV 2021) is
talking-heads attention over all patch tokens, quadratic in their number: at 800x1344 a /16 grid
has 4,200 tokens and every block holds several ``heads x 4200 x 4200`` maps. ViTDet (Li et al.,
"Exploring Plain Vision Transformer Backbones for Object Detection", ECCV 2022) keeps a few blocks
global and lets the others attend within non-overlapping windows, padding the grid to a multiple
of the window.

``GridTalkingHeadAttn`` is timm's ``TalkingHeadAttn`` (same parameters and state-dict keys, so every
CaiT checkpoint loads unchanged) whose ``forward`` also accepts a ``(B, H, W, C)`` grid: it flattens
the grid (``window_size=0``) or cuts it into windows with timm's ``window_partition`` /
``window_unpartition`` (SAM's ViTDet helpers) and runs timm's own attention on the result; the
attention math is never copied. Pass it to timm's ``Cait(attn_block=...)`` and set ``window_size``
per block.
"""
import torch
from timm.models.cait import TalkingHeadAttn
from timm.models.vision_transformer_sam import window_partition, window_unpartition

__all__ = ['GridTalkingHeadAttn']


class GridTalkingHeadAttn(TalkingHeadAttn):
    """timm's ``TalkingHeadAttn`` over a token grid, globally or in ``window_size`` windows.

    Args:
        *args: ``TalkingHeadAttn``'s (``dim``, ``num_heads``, ``qkv_bias``, ...).
        window_size (int): 0 for global attention; ``k > 0`` for attention within non-overlapping
            ``k x k`` windows (the grid is zero-padded at the bottom/right to a multiple of ``k``
            and the padding tokens take part in the attention of their window, as in ViTDet).
            A grid that fits in one window is attended globally, without padding. Default: 0.
        **kwargs: ``TalkingHeadAttn``'s keyword arguments.
    """

    def __init__(self, *args, window_size: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.window_size = window_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Args:
            x (Tensor): ``(B, H, W, C)`` grid of tokens, or ``(B, N, C)`` tokens (then exactly
                timm's global attention; ``window_size`` needs the grid).

        Returns:
            Tensor: same shape as ``x``.
        """
        if x.dim() == 3:
            return super().forward(x)
        B, H, W, C = x.shape
        ws = self.window_size
        if not ws or (H <= ws and W <= ws):
            return super().forward(x.reshape(B, H * W, C)).reshape(B, H, W, C)
        windows, pad_hw = window_partition(x, ws)  # (B * nW, ws, ws, C)
        out = super().forward(windows.reshape(-1, ws * ws, C))
        return window_unpartition(out.reshape(-1, ws, ws, C), ws, (H, W), pad_hw)

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}' if self.window_size else 'global'
