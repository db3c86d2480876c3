"""``ColumnarPyramid``: rescales a columnar transformer's single-stride taps into a feature pyramid.

A ``ColumnarBackbone`` holds it as ``adapter`` (its checkpoints' keys ``adapter.*``).

XCiT appendix B.2 (Ali et al., 2021): features tapped from four blocks of a columnar model, all at
the patch stride, are rescaled to strides 4/8/16/32 so that FPN-style necks can consume them.
Downsampling is max-pooling; upsampling is a transposed convolution (kernel 2, stride 2), with a
norm and GELU between two of them when a level needs a 4x upsampling (patch 16 -> stride 4), as in
the official XCiT detection code.

It knows nothing about the trunk: it takes a list of NCHW maps at one stride.

On CPUs the transposed convolutions run as one GEMM and a pixel shuffle (``ConvTranspose2x2``):
kernel 2 / stride 2 means every input pixel writes its own 2x2 block, so the layer is a 1x1
convolution to ``4 * C_out`` channels followed by a depth-to-space, faster than oneDNN's
transposed-convolution kernel (docs/speed.md#pyramid-adapter-on-cpus).
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmengine.model import BaseModule

from ...tracing import capturing_for_other_sizes

__all__ = ['ColumnarPyramid', 'ConvTranspose2x2']

#: the strides of the four taps the papers use (XCiT appendix B.2), finest first
PAPER_STRIDES = (4, 8, 16, 32)


class _BiasAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.bias_dtype = bias.dtype
        return y + bias.to(y.dtype).view(1, -1, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return grad, grad.sum((0, 2), dtype=torch.float32).to(ctx.bias_dtype)


def add_bias(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``y + bias`` for ``y`` of shape ``(B, C, N)``, the bias's gradient summed in float32 as
    PyTorch's convolution kernels sum it. A plain broadcast add leaves that sum to ``sum_to_size``
    in the gradient's dtype, which under CPU bf16 autocast on torch 2.1 accumulates in bf16
    (docs/training.md#mixed-precision)."""
    return _BiasAdd.apply(y, bias)


class ConvTranspose2x2(nn.ConvTranspose2d):
    """``nn.ConvTranspose2d(in_channels, out_channels, kernel_size=2, stride=2)``, GEMM-based on CPUs.

    Same parameters and state-dict keys as the PyTorch layer (official checkpoints load unchanged)
    and the same values to float rounding. On CPUs the forward is one batched GEMM of the input
    with the weight viewed as ``(4 * C_out, C_in)`` (the bias folded in) and a pixel shuffle; other
    devices, and exports (ONNX, torch.export, tracing), run PyTorch's kernel.

    Args:
        in_channels (int): Input channels.
        out_channels (int): Output channels.
    """

    INFERENCE_ROWS_PER_STEP = 16

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # exporting: one ConvTranspose op (the row loop below would freeze the input's height)
        if x.device.type != 'cpu' or x.dim() != 4 or capturing_for_other_sizes():
            return super().forward(x)
        B, _, H, W = x.shape
        # weight (C_in, C_out, 2, 2) -> rows o * 4 + i * 2 + j, the channel order pixel_shuffle reads
        weight = self.weight.flatten(1).t().expand(B, -1, -1)
        bias = self.bias.repeat_interleave(4).view(1, -1, 1)

        def up(rows: torch.Tensor) -> torch.Tensor:
            y = torch.baddbmm(bias, weight, rows.flatten(2))
            return F.pixel_shuffle(y.view(B, -1, rows.shape[2], W), 2)

        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            y = add_bias(torch.bmm(weight, x.flatten(2)), bias.view(-1))
            return F.pixel_shuffle(y.view(B, -1, H, W), 2)
        # inference: a few input rows at a time, so the pre-shuffle map never exists whole and the
        # peak stays at the output's size, as with PyTorch's kernel
        out = None
        step = max(1, self.INFERENCE_ROWS_PER_STEP)
        for r in range(0, H, step):
            y = up(x[:, :, r:r + step])
            if out is None:
                out = y.new_empty(B, y.shape[1], 2 * H, 2 * W)
            out[:, :, 2 * r:2 * r + y.shape[2]] = y
        return out


class ColumnarPyramid(BaseModule):
    """Rescale same-stride maps to a pyramid of strides.

    Contract: ``forward`` takes ``len(out_strides)`` maps of shape ``(B, embed_dim, h, w)`` at stride
    ``in_stride`` and returns a tuple of maps at strides ``out_strides``; level ``i`` has shape
    ``(B, embed_dim, h * in_stride // s_i, w * in_stride // s_i)`` where upsampling is exact and
    max-pooling floors. The backbone pads its input to a multiple of ``max(out_strides)`` so that
    every level is exact: an input of ``H x W`` gives level sizes
    ``ceil(H / 32) * 32 / s_i x ceil(W / 32) * 32 / s_i``.

    With ``in_stride=8`` the levels are ConvT, identity, max-pool 2, max-pool 4; with
    ``in_stride=16``: ConvT-norm-GELU-ConvT, ConvT, identity, max-pool 2. Each level is an
    ``nn.Sequential`` whose indices match the official XCiT ``fpn1..fpn4`` modules, so their
    weights load by renaming ``fpn{i+1}`` to ``levels.{i}``.

    Args:
        embed_dim (int): Channels of every input and output map.
        in_stride (int): Stride of the input maps (the trunk's patch size). Default: 16.
        out_strides (Sequence[int]): Output strides, powers of two. Default: (4, 8, 16, 32).
        norm_cfg (dict): Norm between two transposed convs. Default: ``dict(type='BN')``.
        act_cfg (dict): Activation between two transposed convs. Default: ``dict(type='GELU')``.
        init_cfg (dict, optional): mmengine init config. Default: None.
    """

    @staticmethod
    def check_strides(in_stride: int, out_strides: Sequence[int]) -> None:
        """Raises ValueError unless every stride is a power of two."""
        for s in (in_stride, *out_strides):
            if s < 1 or s & (s - 1):
                raise ValueError(f'ColumnarPyramid: strides must be powers of two, got {s} '
                                 f'(in_stride={in_stride}, out_strides={tuple(out_strides)}).')

    def __init__(self,
                 embed_dim: int,
                 in_stride: int = 16,
                 out_strides: Sequence[int] = (4, 8, 16, 32),
                 norm_cfg: Optional[dict] = None,
                 act_cfg: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        norm_cfg = norm_cfg or dict(type='BN', requires_grad=True)
        act_cfg = act_cfg or dict(type='GELU')
        self.check_strides(in_stride, out_strides)
        self.embed_dim = embed_dim
        self.in_stride = in_stride
        self.out_strides = tuple(out_strides)
        self.levels = nn.ModuleList(
            self._make_level(embed_dim, in_stride, s, norm_cfg, act_cfg) for s in self.out_strides)

    @staticmethod
    def _make_level(dim: int, in_stride: int, out_stride: int, norm_cfg: dict,
                    act_cfg: dict) -> nn.Module:
        if out_stride == in_stride:
            return nn.Identity()
        if out_stride > in_stride:
            k = out_stride // in_stride
            return nn.Sequential(nn.MaxPool2d(kernel_size=k, stride=k))
        layers: List[nn.Module] = []
        for i in range(int(math.log2(in_stride // out_stride))):
            if i:
                layers += [build_norm_layer(norm_cfg, dim)[1], build_activation_layer(act_cfg)]
            layers.append(ConvTranspose2x2(dim, dim))
        return nn.Sequential(*layers)

    def forward(self, feats: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        if len(feats) != len(self.levels):
            raise ValueError(
                f'ColumnarPyramid expects {len(self.levels)} feature maps (one per output stride '
                f'{self.out_strides}), got {len(feats)}: give the backbone as many out_indices as '
                f'out_strides.')
        return tuple(level(x) for level, x in zip(self.levels, feats))
