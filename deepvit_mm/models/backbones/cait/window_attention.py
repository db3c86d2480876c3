"""timm's talking-heads attention on a token grid, global or within ViTDet's windows, its queries
in chunks.

CaiT's self-attention (Touvron et al., "Going deeper with Image Transformers", ICCV 2021) is
talking-heads attention over all patch tokens, quadratic in their number: at 800x1344 a /16 grid
has 4,200 tokens and every block holds several ``heads x 4200 x 4200`` maps; windows
(``..windows``, ViTDet's, shared with ``TimmViT``) bound them.

``GridTalkingHeadAttn`` is timm's ``TalkingHeadAttn`` (same parameters and state-dict keys, so every
CaiT checkpoint loads unchanged) with ``..windows.GridAttention``'s grid: ``CaiT`` gives it to
the attention of each block timm built, with its ``window_size`` (``..adapt``).

**Query chunks** (``talking_heads_chunked``): timm materialises every ``heads x N x N`` map several
times over (the logits, their head-mixed and softmaxed versions, and the channels-last copies its
``proj_l`` / ``proj_w`` Linears over the head axis need). Here the queries go ``query_chunk`` rows
at a time: each chunk's maps stay small, the head mixing is one batched GEMM over the flat map (no
permuted copies), and the result and its gradients are the same to float rounding. Inference
memory is O(heads x chunk x N) instead of O(heads x N^2); speed: docs/cait.md#query-chunked-attention.
"""
from typing import Optional, Union

import torch
from timm.models.cait import TalkingHeadAttn

from ....tracing import capturing_for_other_sizes
from ..windows import GridAttention

__all__ = ['GridTalkingHeadAttn', 'talking_heads_chunked', 'CPU_QUERY_CHUNK']


# Query rows per step of ``talking_heads_chunked`` on CPUs; tuned by measurement:
# docs/cait.md#query-chunked-attention
CPU_QUERY_CHUNK = 128


def default_query_chunk(device: torch.device) -> Optional[int]:
    """Query rows per step of ``talking_heads_chunked`` for 'auto': ``CPU_QUERY_CHUNK`` on CPUs,
    None (timm's attention) elsewhere. None while exporting (ONNX, torch.export, tracing): the
    chunk loop would freeze the example input's token count into the graph; an explicit
    ``query_chunk`` (``query_chunks=True``) still chunks, at that size only."""
    if capturing_for_other_sizes():
        return None
    return CPU_QUERY_CHUNK if device.type == 'cpu' else None


def talking_heads_chunked(attn: TalkingHeadAttn, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """timm's ``TalkingHeadAttn.forward(x)`` computed ``chunk`` query rows at a time.

    Differentiable; attention dropout is not applied (callers use timm's attention when it is
    active). Under autocast the matmuls run in the autocast dtype and the softmax in float32, as
    in timm's.

    Args:
        attn (TalkingHeadAttn): timm's module (its parameters are used as they are).
        x (Tensor): Tokens ``(B, N, C)``.
        chunk (int): Query rows per step.

    Returns:
        Tensor: ``(B, N, C)``, equal to ``attn(x)``.
    """
    B, N, C = x.shape
    h = attn.num_heads
    q, k, v = attn.qkv(x).reshape(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4).unbind(0)
    q = q * attn.scale
    kt = k.transpose(-2, -1)
    # head mixing (timm: Linear over the head axis of a permuted map) as (h x h) @ (h x n*N)
    wl = attn.proj_l.weight.expand(B, h, h)
    bl = attn.proj_l.bias.view(1, h, 1).expand(B, h, 1)
    ww = attn.proj_w.weight.expand(B, h, h)
    bw = attn.proj_w.bias.view(1, h, 1).expand(B, h, 1)
    outs = []
    for i in range(0, N, chunk):
        n = min(chunk, N - i)
        a = torch.matmul(q[:, :, i:i + n], kt)                                   # (B, h, n, N)
        a = torch.baddbmm(bl, wl, a.reshape(B, h, n * N)).view(B, h, n, N).softmax(dim=-1)
        a = torch.baddbmm(bw, ww, a.reshape(B, h, n * N)).view(B, h, n, N)
        outs.append(torch.matmul(a, v))                                          # (B, h, n, d)
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    return attn.proj_drop(attn.proj(out.transpose(1, 2).reshape(B, N, C)))


class GridTalkingHeadAttn(GridAttention, TalkingHeadAttn):
    """timm's ``TalkingHeadAttn`` over a token grid, globally or in ``window_size`` windows
    (``GridAttention``), its queries in chunks where that is faster (``query_chunk``).

    Args:
        *args: ``TalkingHeadAttn``'s (``dim``, ``num_heads``, ``qkv_bias``, ...).
        window_size (int): 0 for global attention; ``k > 0`` for attention within
            non-overlapping ``k x k`` windows. Default: 0.
        **kwargs: ``TalkingHeadAttn``'s keyword arguments.
    """
    #: 'auto': query chunks where they are faster (``default_query_chunk``); an int: always, with
    #: that many rows per chunk; None: timm's attention
    query_chunk: Union[int, str, None] = 'auto'

    def __init__(self, *args, window_size: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.window_size = window_size

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        chunk = self.query_chunk
        if chunk == 'auto':
            chunk = default_query_chunk(x.device)
        if chunk and x.shape[1] > chunk and (not self.training or not self.attn_drop.p):
            return talking_heads_chunked(self, x, chunk)
        return TalkingHeadAttn.forward(self, x)

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, query_chunk={self.query_chunk!r}'
