"""``CPUSingleRoIExtractor``: mmdet's ``SingleRoIExtractor`` with a faster RoIAlign on CPU.

mmcv's CPU RoIAlign runs one RoI after another on one thread, and its backward scatters one
sample at a time: in the detection demo's training step (XCiT-N12/8 Mask R-CNN, 256x256, batch 2)
its forward and backward were half of the RoI heads' time. RoIAlign is linear in the features:
each output bin is a weighted sum of at most ``4 * s * s`` feature-map pixels (``s x s``
bilinear samples of 4 pixels each). So, on CPU, this extractor gathers the bins of every RoI of
every level in one ``F.embedding_bag`` over a table of all levels' pixels (channels last), with
the bilinear weights as ``per_sample_weights``: torch's multithreaded gather, and its backward a
dense scatter-add. The weights follow mmcv's kernel exactly (its clamping at the borders, zero
for samples beyond them, ``aligned``), so outputs and gradients equal mmcv's to float32 rounding
(``tests/models/roi_heads/test_roi_extractor.py``).

The fast path needs RoIAlign layers in ``'avg'`` mode with a fixed ``sampling_ratio > 0`` (the
adaptive ``0`` gives each RoI its own sample count) and float features on CPU; anything else runs
mmdet's ``SingleRoIExtractor.forward`` unchanged, as do exports (``deepvit_mm.deploy`` reads the
same ``roi_layers``). Use it as a drop-in ``type`` of ``bbox_roi_extractor`` /
``mask_roi_extractor``::

    bbox_roi_extractor=dict(type='CPUSingleRoIExtractor',
                            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=2), ...)
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from mmcv.ops import RoIAlign
from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
from mmdet.registry import MODELS
from torch import Tensor

__all__ = ['CPUSingleRoIExtractor']


def _axis(start: Tensor, size: Tensor, bins: int, samples: int, length: Tensor
          ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per RoI, the ``bins * samples`` sample positions along one axis of its feature map
    (``length`` pixels) as mmcv's RoIAlign kernel places them: ``(low, high, weight of low,
    weight of high)``, each ``(R, bins * samples)``; samples outside ``[-1, length]`` weigh 0."""
    k = torch.arange(bins * samples, device=start.device)
    bin_size = (size / bins)[:, None]
    length = length[:, None]
    # bin b, sample i: start + b * bin_size + (i + 0.5) * bin_size / samples, mmcv's order
    pos = (start[:, None] + torch.div(k, samples, rounding_mode='floor') * bin_size
           + (k % samples + 0.5) * bin_size / samples)
    valid = (pos >= -1.0) & (pos <= length)
    pos = pos.clamp(min=0)
    low = torch.minimum(pos.long(), length - 1)
    at_end = low >= length - 1
    pos = torch.where(at_end, low.to(pos.dtype), pos)
    high = torch.where(at_end, low, low + 1)
    frac = pos - low
    return low, high, (1 - frac) * valid, frac * valid


def roi_align_gather(feats: Tuple[Tensor, ...], rois: Tensor, levels: Tensor,
                     spatial_scales: Tuple[float, ...], output_size: Tuple[int, int],
                     sampling_ratio: int, aligned: bool = True) -> Tensor:
    """mmcv's ``roi_align`` (``'avg'`` mode, fixed ``sampling_ratio``) of each RoI on its level,
    for all levels at once, as one ``F.embedding_bag``.

    Args:
        feats (tuple[Tensor]): Feature maps ``(B, C, H_l, W_l)``, one per level.
        rois (Tensor): ``(R, 5)``: batch index, x1, y1, x2, y2 in input pixels.
        levels (Tensor): ``(R,)`` the level each RoI is pooled from.
        spatial_scales (tuple[float]): Per level, feature-map pixels per input pixel.
        output_size (tuple[int, int]): ``(out_h, out_w)`` bins.
        sampling_ratio (int): Samples per bin along each axis (> 0).
        aligned (bool): mmcv's ``aligned`` (half-pixel offset). Default: True.

    Returns:
        Tensor: ``(R, C, out_h, out_w)`` in float32 (channels-last strides).
    """
    (out_h, out_w), s = output_size, sampling_ratio
    n, channels = len(rois), feats[0].shape[1]
    # one table of every level's pixels, channels last: row = first_l + (b * H_l + y) * W_l + x
    table = torch.cat([f.float().permute(0, 2, 3, 1).reshape(-1, channels) for f in feats])
    shapes = torch.tensor([f.shape[-2:] for f in feats], dtype=torch.long)
    first = torch.tensor([0] + [f.shape[0] * f.shape[2] * f.shape[3] for f in feats[:-1]],
                         dtype=torch.long).cumsum(0)
    height, width = shapes[levels, 0], shapes[levels, 1]
    scale = torch.tensor(spatial_scales, dtype=torch.float32)[levels]
    rois = rois.float()
    offset = 0.5 if aligned else 0.0
    x1, y1 = rois[:, 1] * scale - offset, rois[:, 2] * scale - offset
    w, h = rois[:, 3] * scale - offset - x1, rois[:, 4] * scale - offset - y1
    if not aligned:
        w, h = w.clamp(min=1), h.clamp(min=1)
    y_low, y_high, wy_low, wy_high = _axis(y1, h, out_h, s, height)
    x_low, x_high, wx_low, wx_high = _axis(x1, w, out_w, s, width)
    base = first[levels] + rois[:, 0].long() * height * width
    # (R, out_h, s, 2) rows and weights along y; (R, out_w, s, 2) columns and weights along x
    yi = torch.stack([y_low, y_high], -1).view(n, out_h, s, 2) * width[:, None, None, None]
    wy = torch.stack([wy_low, wy_high], -1).view(n, out_h, s, 2)
    xi = torch.stack([x_low, x_high], -1).view(n, out_w, s, 2)
    wx = torch.stack([wx_low, wx_high], -1).view(n, out_w, s, 2) / (s * s)
    # bag (r, bin_y, bin_x) of s * s samples x 4 corners: (r, bin_y, bin_x, sy, sx, cy, cx)
    index = (base[:, None, None, None, None, None, None]
             + yi[:, :, None, :, None, :, None] + xi[:, None, :, None, :, None, :])
    weight = wy[:, :, None, :, None, :, None] * wx[:, None, :, None, :, None, :]
    pooled = F.embedding_bag(index.reshape(n * out_h * out_w, -1), table, mode='sum',
                             per_sample_weights=weight.reshape(n * out_h * out_w, -1))
    return pooled.view(n, out_h, out_w, channels).permute(0, 3, 1, 2)


@MODELS.register_module()
class CPUSingleRoIExtractor(SingleRoIExtractor):
    """mmdet's ``SingleRoIExtractor``; on CPU with RoIAlign layers in ``'avg'`` mode and a fixed
    ``sampling_ratio``, every level's RoIAlign runs as one weighted gather
    (``roi_align_gather``, the module docstring says why). Same arguments, outputs and
    gradients."""

    def _gather_settings(self, feats: Tuple[Tensor, ...]) -> Optional[dict]:
        layers = self.roi_layers
        first = layers[0]
        if feats[0].device.type != 'cpu' or not feats[0].is_floating_point():
            return None
        same = all(isinstance(layer, RoIAlign) and layer.output_size == first.output_size
                   and layer.sampling_ratio == first.sampling_ratio
                   and layer.aligned == first.aligned and layer.pool_mode == 'avg'
                   and not getattr(layer, 'use_torchvision', False) for layer in layers)
        if not same or first.sampling_ratio <= 0:
            return None
        return dict(spatial_scales=tuple(float(layer.spatial_scale) for layer in layers),
                    output_size=tuple(first.output_size), sampling_ratio=first.sampling_ratio,
                    aligned=first.aligned)

    def forward(self, feats: Tuple[Tensor], rois: Tensor,
                roi_scale_factor: Optional[float] = None) -> Tensor:
        settings = self._gather_settings(tuple(feats))
        if settings is None or len(rois) == 0:
            return super().forward(feats, rois, roi_scale_factor)
        feats = tuple(feats[:len(self.roi_layers)])
        # as SingleRoIExtractor: the RoIs take the features' dtype (float16/bfloat16 under amp)
        rois = rois.type_as(feats[0])
        if len(feats) == 1:  # as the parent: one level ignores roi_scale_factor
            levels = rois.new_zeros(len(rois), dtype=torch.long)
        else:
            levels = self.map_roi_levels(rois, len(feats))
            if roi_scale_factor is not None:
                rois = self.roi_rescale(rois, roi_scale_factor)
        with torch.autocast('cpu', enabled=False):
            out = roi_align_gather(feats, rois, levels, **settings)
        return out.to(feats[0].dtype)
