"""A faster forward for timm's XCiT blocks: same parameters, same math, fewer passes over memory.

XCiT (Ali et al., NeurIPS 2021) spends most of a dense-prediction forward on memory-bound work
around its GEMMs (copies from permutes, l2-norms over the token axis, LayerScale multiplies, ...;
docs/speed.md#the-xcit-fast-forward). This module runs timm's ``XCABlock`` with its own
parameters but rewrites three parts, each exactly equal in real arithmetic:

* **Cross-covariance attention from the Gram matrix.** With a linear ``qkv`` (``q = x Wq^T + bq``,
  likewise ``k``, ``v``), everything XCA needs is a function of ``G = x^T x`` (C x C) and the token
  sum ``s = x^T 1``: ``q^T k = Wq G Wk^T + (Wq s) bk^T + bq (Wk s)^T + N bq bk^T`` per head, and the
  squared l2-norms of q and k over the tokens are the diagonals of the same forms. The attention
  output followed by ``proj`` is one linear map per image,
  ``out = x (Wp blockdiag(A) Wv)^T + Wp blockdiag(A) bv + bp``.
  So q, k and v are never materialised: one (N x C) x (C x C) GEMM builds ``G``, one applies the
  folded map, and the rest is C x C work. That is 2NC^2 multiply-adds instead of 4NC^2 plus the
  permute copies, normalisations and batched products of the token-space formulation. The
  attention is invariant to scaling ``[[G, s], [s^T, N]]`` (q and k are l2-normalised), so ``G`` is
  formed as a mean, ``y^T y / N`` (the GEMM's ``alpha``): in float16 a sum over N tokens overflows
  (65504) from a few thousand tokens on.
* **Local patch interaction on contiguous NCHW maps** (training). timm's LPI hands its depthwise
  convs a channels-last *view* of the tokens; on CPU, forward + backward of the LPI is faster on a
  contiguous NCHW copy (docs/speed.md#the-xcit-fast-forward). Inference uses the view.
* **LayerScale residuals in one pass** (``torch.addcmul``) when no drop path is active.
* **Inference** (eval mode, no autograd: ``xca_block_inference``): LayerScale folded into the
  attention map and ``fc2``, residual adds done by the GEMMs, the LPI convs on the channels-last
  view of the tokens; on CPUs the per-token work runs on chunks of tokens that stay in cache.

Everything else (LayerNorms, the MLP, dropouts, drop path) is timm's own module. A block whose
``qkv`` is not an ``nn.Linear`` (e.g. a non-linear Q/K/V embedding) falls back to timm's XCA.

Folding the attention costs O(C^3) per image whatever the number of tokens N, and on a GPU the
extra kernels cost host time: on small inputs timm's forward is faster. ``xca_block_forward_auto``
(the backbone's default) takes this path only where ``fast_path_helps`` says it is faster.

The backbone's ``gram_xca`` switch gives its blocks one of the classes at the end
(``GramXCABlock``, ``AutoGramXCABlock``, ``CompiledAutoGramXCABlock``: timm's ``XCABlock`` with
one of these forwards) or timm's class back, in place (``..adapt``).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from timm.models.xcit import XCABlock

from ....compat.torch import autocast_dtype, autocast_enabled
from ....tracing import capturing_for_other_sizes
from ..timm_releases import drop_path_of

__all__ = ['fast_path_helps']


def has_linear_qkv(attn: nn.Module) -> bool:
    """Whether ``attn.qkv`` is a plain ``nn.Linear`` (what the Gram formulation needs)."""
    return type(attn.qkv) is nn.Linear


def _chunks(n: int, size: int):
    for i in range(0, n, size):
        yield slice(i, min(i + size, n))


def _matmul_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    return autocast_dtype(dev) if autocast_enabled(dev) else x.dtype


def token_gram(y: torch.Tensor, n: int) -> torch.Tensor:
    """``y^T y / n`` of tokens ``y`` ``(B, N', C)`` as one GEMM (the scale is its ``alpha``,
    applied to the float32 accumulator), in the GEMM's dtype (autocast's)."""
    return torch.baddbmm(y.new_zeros(()), y.transpose(1, 2), y, beta=0, alpha=1.0 / n)


def _augmented(attn: nn.Module, gram: torch.Tensor, tok_sum: Optional[torch.Tensor],
               n: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``fold_xca``'s Gram matrix and ``qkv`` weight in float32, with a ``qkv`` bias the
    constant-1 column added to both: ``[[G, s], [s^T, n]]`` (B, C+1, C+1) and ``[W | b]``
    (3C, C+1)."""
    g = gram.float()
    w = attn.qkv.weight.float()                                   # (3C, C)
    if attn.qkv.bias is None:
        return g, w
    B = gram.shape[0]
    s = tok_sum.float().unsqueeze(1)                              # (B, 1, C)
    g = torch.cat([torch.cat([g, s], 1),
                   torch.cat([s.transpose(1, 2), s.new_full((B, 1, 1), float(n))], 1)], 2)
    return g, torch.cat([w, attn.qkv.bias.float().unsqueeze(1)], 1)


def fold_xca(attn: nn.Module, gram: torch.Tensor, tok_sum: Optional[torch.Tensor], n: float,
             gamma: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """timm's ``XCA`` (times LayerScale ``gamma``) as one linear map per image, from ``y^T y``.

    A ``qkv`` bias is handled by augmenting the tokens with a constant 1: ``q = [y, 1] [Wq, bq]^T``
    and the Gram matrix of ``[y, 1]`` is ``[[G, s], [s^T, n]]``, so the biased case is the same
    bias-free algebra one column wider (and about 20 tensor ops per block, few enough that the
    per-op overhead stays small on GPUs and on small inputs).

    The attention depends on ``[[G, s], [s^T, n]]`` only up to a positive factor, so ``gram``,
    ``tok_sum`` and ``n`` may all be divided by the number of tokens (what the callers pass: the
    means ``token_gram`` gives, and 1).

    Args:
        attn (nn.Module): A timm ``XCA`` with a linear ``qkv``.
        gram (Tensor): ``y^T y`` of the image's tokens ``y``, ``(B, C, C)``, or a positive
            multiple of it.
        tok_sum (Tensor, optional): ``y^T 1``, ``(B, C)``, times the same factor; needed (and
            only read) when ``qkv`` has a bias.
        n (float): Number of tokens, times the same factor.
        gamma (Tensor, optional): LayerScale to fold into the output projection.

    Returns:
        tuple: ``(weight, bias)`` of shapes ``(B, C_out, C_in)`` and ``(B, C_out)`` in float32,
        such that ``gamma * attn(y) = y @ weight^T + bias`` (dropout aside). ``weight`` may be a
        strided view.
    """
    B, C = gram.shape[0], gram.shape[-1]
    h = attn.num_heads
    d = C // h
    # the C x C algebra is cheap: run it in float32 even under autocast
    with torch.autocast(gram.device.type, enabled=False):
        g, w = _augmented(attn, gram, tok_sum, n)
        wqk = w[:2 * C]
        gw = g @ wqk.t()                                          # [G Wq^T | G Wk^T] (B, C', 2C)
        # squared l2 norms of q's and k's channels over the tokens, then F.normalize's clamp
        inv = (gw.transpose(1, 2) * wqk).sum(-1).clamp_min(1e-24).rsqrt()  # (B, 2C)
        qk = torch.einsum('hdi,bihe->bhde', wqk[:C].view(h, d, -1),
                          gw[..., C:].view(B, -1, h, d))          # Wq G Wk^T per head
        scale = inv[:, :C].view(B, h, d, 1) * inv[:, C:].view(B, h, 1, d)
        a = attn.attn_drop((qk * scale * attn.temperature.float()).softmax(dim=-1))
        return _fold_projection(attn, a, w[2 * C:], gamma)


def _fold_projection(attn: nn.Module, a: torch.Tensor, wv: torch.Tensor,
                     gamma: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``proj(blockdiag(A) v)`` (times ``gamma``) as ``fold_xca``'s ``(weight, bias)``: the
    attention ``a`` (B, h, d, d), ``Wv`` (``wv``: C x C, or C x C+1 with ``bv`` as its last column)
    and ``Wp`` folded into one map per image."""
    B, h, d = a.shape[:3]
    C = h * d
    wp = attn.proj.weight.float()
    pb = attn.proj.bias.float() if attn.proj.bias is not None else a.new_zeros(C)
    if gamma is not None:
        wp = wp * gamma.float().unsqueeze(1)
        pb = pb * gamma.float()
    av = torch.einsum('bhde,hei->bhdi', a, wv.view(h, d, -1)).reshape(B, C, -1)
    fused = wp @ av                                               # (B, C, C') = [W | W_p A b_v]
    weight = fused[..., :C]
    out_bias = fused[..., C] + pb if wv.shape[1] > C else pb.expand(B, C)
    return weight, out_bias


def xca_from_gram(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm's ``XCA.forward(x)`` computed from ``x^T x`` (see the module docstring).

    Args:
        attn (nn.Module): A timm ``XCA`` with a linear ``qkv``.
        x (Tensor): Tokens ``(B, N, C)``.

    Returns:
        Tensor: ``(B, N, C)``, equal to ``attn(x)``.
    """
    n = x.shape[1]
    tok_mean = x.mean(1) if attn.qkv.bias is not None else None
    weight, bias = fold_xca(attn, token_gram(x, n), tok_mean, 1.0)
    dtype = _matmul_dtype(x)
    out = torch.baddbmm(bias.to(dtype).unsqueeze(1), x.to(dtype), weight.to(dtype).transpose(1, 2))
    return attn.proj_drop(out)


def lpi_forward(lpi: nn.Module, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """timm's ``LPI.forward`` on a contiguous NCHW copy of the tokens."""
    B, N, C = x.shape
    y = x.transpose(1, 2).reshape(B, C, H, W).contiguous()
    y = lpi.conv2(lpi.bn(lpi.act(lpi.conv1(y))))
    return y.flatten(2).transpose(1, 2)


def _residual(x: torch.Tensor, gamma: torch.Tensor, y: torch.Tensor,
              drop_path: nn.Module) -> torch.Tensor:
    if isinstance(drop_path, nn.Identity) or not drop_path.training:
        return torch.addcmul(x, gamma, y)
    return x + drop_path(gamma * y)


# When the Gram forward is expected to beat timm's (the 'auto' setting); the thresholds are tuned
# by measurement: docs/speed.md#when-auto-takes-it
# * CPU: folding the attention costs ~6 C^3 multiply-adds per image and block whatever the input,
#   saving ~4 N C^2: a loss under N ~ C tokens, a gain from a few C on.
CPU_MIN_TOKENS_PER_CHANNEL = 2
# * CUDA: the Gram forward does less GPU work but launches more kernels; until the batch's work
#   (B N C^2) keeps the GPU busier than the host is, it is host-bound and slower. bf16/fp16 work
#   runs faster, so it takes more of it to hide the same host time.
CUDA_MIN_WORK_FP32 = 2e9
CUDA_MIN_WORK_LOW_PRECISION = 4e9
# * Export (ONNX, torch.export, tracing): the rule above depends on the input's size, and the exported
#   graph would keep the branch taken for the example input at every size; 'auto' takes this fixed
#   path instead, and ``xca_block_inference`` runs unchunked (a loop over tokens would freeze
#   their number). The choice is ONNX Runtime's speed, docs/deployment.md.
EXPORT_FAST_PATH = True


def fast_path_helps(x: torch.Tensor) -> bool:
    """The 'auto' rule: whether ``xca_block_forward`` is expected to be faster than timm's
    ``XCABlock.forward`` on tokens ``x`` ``(B, N, C)`` (the thresholds above; devices other than
    CPU and CUDA: False; while exporting: ``EXPORT_FAST_PATH``)."""
    if capturing_for_other_sizes():
        return EXPORT_FAST_PATH
    B, N, C = x.shape
    dev = x.device.type
    if dev == 'cpu':
        return N >= CPU_MIN_TOKENS_PER_CHANNEL * C
    if dev == 'cuda':
        low = x.dtype in (torch.float16, torch.bfloat16) or (
            autocast_enabled(dev) and autocast_dtype(dev) != torch.float32)
        return B * N * C * C >= (CUDA_MIN_WORK_LOW_PRECISION if low else CUDA_MIN_WORK_FP32)
    return False


def xca_block_forward_auto(blk: nn.Module, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """``xca_block_forward`` where ``fast_path_helps(x)``, timm's ``XCABlock.forward`` elsewhere."""
    if fast_path_helps(x):
        return xca_block_forward(blk, x, H, W)
    return XCABlock.forward(blk, x, H, W)


def xca_block_forward_auto_compiled(blk: nn.Module, x: torch.Tensor, H: int,
                                    W: int) -> torch.Tensor:
    """The 'auto' rule where the blocks' attention and MLP are compiled (``compile_blocks``): on
    a CPU as in eager, where the faster forward with the MLP compiled beats timm's forward with
    its attention compiled (docs/training.md#compiling-the-backbone); elsewhere timm's
    ``XCABlock.forward``, whose attention is then compiled too, which compiled is the faster of
    the two on a GPU (docs/speed.md#what-does-compiling-give-on-a-gpu)."""
    if x.device.type == 'cpu':
        return xca_block_forward_auto(blk, x, H, W)
    return XCABlock.forward(blk, x, H, W)


def xca_block_forward(blk: nn.Module, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """timm's ``XCABlock.forward(x, H, W)`` through the faster parts above.

    Args:
        blk (nn.Module): A timm ``XCABlock``.
        x (Tensor): Tokens ``(B, H * W, C)``.
        H (int): Token grid height.
        W (int): Token grid width.

    Returns:
        Tensor: ``(B, H * W, C)``.
    """
    attn = blk.attn
    if not torch.is_grad_enabled() and not blk.training and has_linear_qkv(attn):
        return xca_block_inference(blk, x, H, W)
    y = blk.norm1(x)
    y = xca_from_gram(attn, y) if has_linear_qkv(attn) else attn(y)
    x = _residual(x, blk.gamma1, y, drop_path_of(blk, 1))
    # timm's order: LPI (gamma3) before the MLP (gamma2), as in the official code
    x = _residual(x, blk.gamma3, lpi_forward(blk.local_mp, blk.norm3(x), H, W), drop_path_of(blk, 3))
    x = _residual(x, blk.gamma2, blk.mlp(blk.norm2(x)), drop_path_of(blk, 2))
    return x


# --------------------------------------------------------------------------------------------
# inference (no autograd): LayerScale folded, residuals accumulated by the GEMMs
# --------------------------------------------------------------------------------------------
def _add_linear_(out: torch.Tensor, res: torch.Tensor, y: torch.Tensor, weight_t: torch.Tensor,
                 bias: torch.Tensor) -> None:
    """``out = res + y @ weight_t + bias`` (2-D, or batched 3-D), written into ``out`` (which may
    alias ``res``)."""
    if y.dtype == out.dtype:  # one elementwise pass, then the GEMM accumulates in place
        torch.add(res, bias, out=out)
        if out.dim() == 2:
            out.addmm_(y, weight_t)
        else:
            out.baddbmm_(y, weight_t)
    else:  # autocast: the GEMM in its dtype, the residual stream in its own
        mm = torch.addmm if out.dim() == 2 else torch.baddbmm
        torch.add(res, mm(bias, y, weight_t), out=out)


def default_chunk(device: torch.device) -> Optional[int]:
    """Tokens per step of ``xca_block_inference`` on ``device``: 1,024 on CPUs (a chunk's
    intermediates stay in cache), None (every token of every image at once) elsewhere, where
    fewer and larger kernels win. None while exporting (see ``EXPORT_FAST_PATH``)."""
    if capturing_for_other_sizes():
        return None
    return 1024 if device.type == 'cpu' else None


def _attention_inference_(blk: nn.Module, x: torch.Tensor, out: torch.Tensor, groups: list,
                          steps: list, mm_dtype: torch.dtype) -> None:
    """``out = x + gamma1 * attn(norm1(x))`` of ``xca_block_inference``, step by step: pass 1
    accumulates ``y^T y`` (and the token sum) of each group of images, pass 2 applies the folded
    map."""
    N = x.shape[1]
    attn = blk.attn
    with_sum = attn.qkv.bias is not None
    for g in groups:
        gram = tok_sum = None
        for s in steps:  # means over all N tokens (float16 sums would overflow)
            y = blk.norm1(x[g, s].to(out.dtype)).to(mm_dtype)
            part = token_gram(y, N).float()
            gram = part if gram is None else gram + part
            if with_sum:
                part = y.sum(1, dtype=torch.float32) / N
                tok_sum = part if tok_sum is None else tok_sum + part
        del y, part  # (whole: an N x C tensor) not kept through the rest of the block
        fused, fbias = fold_xca(attn, gram, tok_sum, 1.0, gamma=blk.gamma1)
        fused_t, fbias = fused.transpose(1, 2).to(mm_dtype), fbias.unsqueeze(1).to(mm_dtype)
        # norm1 again rather than keeping its output: recomputing a chunk's LayerNorm in cache
        # is cheaper than writing and re-reading an N x C tensor
        for s in steps:
            xs = x[g, s].to(out.dtype)
            _add_linear_(out[g, s], xs, blk.norm1(xs).to(mm_dtype), fused_t, fbias)


def _folded_mlp(blk: nn.Module, dtype: torch.dtype) -> Tuple[torch.Tensor, ...]:
    """``fc1``'s and ``fc2``'s transposed weights and biases in ``dtype``, LayerScale ``gamma2``
    folded into ``fc2``."""
    mlp = blk.mlp
    return (mlp.fc1.weight.t().to(dtype), mlp.fc1.bias.to(dtype),
            (mlp.fc2.weight * blk.gamma2.unsqueeze(1)).t().to(dtype),
            (mlp.fc2.bias * blk.gamma2).to(dtype))


def _groups_and_steps(B: int, N: int, chunk: Optional[int]) -> Tuple[list, list]:
    """The images and the tokens ``xca_block_inference`` takes a step at a time: all at once
    (``chunk=None``), or image by image, ``chunk`` tokens at a time."""
    if chunk is None:
        return [slice(None)], [slice(None)]
    return [slice(b, b + 1) for b in range(B)], list(_chunks(N, chunk))


def xca_block_inference(blk: nn.Module, x: torch.Tensor, H: int, W: int,
                        chunk: Optional[int] = -1) -> torch.Tensor:
    """``XCABlock.forward(x, H, W)`` for inference (eval mode, no autograd).

    LayerScale is folded into the attention's (C x C) map and into ``fc2``, and each residual add
    is the GEMM's own accumulation. With ``chunk`` set, every per-token step (LayerNorms, the
    folded attention map, the MLP and its GELU, the LayerScale residuals) runs one image and
    ``chunk`` tokens at a time, so the MLP's ``4C``-wide hidden layer and the other
    intermediates stay in cache instead of making round trips to memory (what suits a CPU); with
    ``chunk=None`` each step runs once over the whole batch (what suits a GPU). Under autocast
    the GEMMs run in the autocast dtype and the residual stream keeps ``x``'s dtype, as in timm.
    Only valid without autograd and with dropouts / drop path inactive.

    Args:
        chunk (int, optional): Tokens per step, None for all; default (-1): ``default_chunk``.
    """
    B, N, C = x.shape
    mlp, lpi = blk.mlp, blk.local_mp
    if chunk == -1:
        chunk = default_chunk(x.device)
    whole = chunk is None or chunk >= N
    groups, steps = _groups_and_steps(B, N, None if whole else chunk)
    mm_dtype = _matmul_dtype(x)
    # timm's residual adds promote a bf16 input (autocast patch embedding) to the parameters'
    # dtype, as its LayerNorms see it too (CUDA's takes no bf16 input with float32 weights)
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, blk.gamma1.dtype),
                      device=x.device)
    with torch.autocast(x.device.type, enabled=False):
        _attention_inference_(blk, x, out, groups, steps, mm_dtype)
        z = blk.norm3(out)
    # local patch interaction: the tokens (B, N, C) are an NHWC map; its convs run on that
    # channels-last view (no transposing copy), under the caller's autocast
    z = z.view(B, H, W, C).permute(0, 3, 1, 2)
    z = lpi.conv2(lpi.bn(lpi.act(lpi.conv1(z))))
    z = z.permute(0, 2, 3, 1).reshape(B, N, C)
    with torch.autocast(x.device.type, enabled=False):
        # LPI residual, then the MLP (LayerScale folded into fc2), step by step
        w1t, b1, w2t, b2 = _folded_mlp(blk, mm_dtype)
        for g in groups:
            for s in steps:
                torch.addcmul(out[g, s], blk.gamma3, z[g, s], out=out[g, s])
                # a view of `out` itself, not of the op's return value: under torch.compile that
                # value takes z's layout (inductor's convolutions may return z token-strided),
                # which no view flattens ("Cannot view a tensor ... as (N, C)")
                r = out[g, s].view(-1, C)
                if whole:  # consumed: freed before the MLP's 4C-wide hidden layer
                    del z
                hid = mlp.act(torch.addmm(b1, blk.norm2(r).to(mm_dtype), w1t))
                _add_linear_(r, r, mlp.norm(hid), w2t, b2)
    return out


class GramXCABlock(XCABlock):
    """timm's ``XCABlock`` through ``xca_block_forward`` (``gram_xca=True``)."""
    forward = xca_block_forward


class AutoGramXCABlock(XCABlock):
    """timm's ``XCABlock`` through ``xca_block_forward_auto`` (``gram_xca='auto'``)."""
    forward = xca_block_forward_auto


class CompiledAutoGramXCABlock(XCABlock):
    """timm's ``XCABlock`` through ``xca_block_forward_auto_compiled`` (``gram_xca='auto'`` with
    ``compile_blocks``)."""
    forward = xca_block_forward_auto_compiled
