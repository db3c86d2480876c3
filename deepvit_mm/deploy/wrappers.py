"""What an exported graph computes: the Runner's own modules behind a one-tensor forward.

Each wrapper holds the model the Runner trains (no copy, no second implementation of any layer)
and defines the export contract: one input ``input``, the image batch after the model's data
preprocessor (normalised, padded), ``(1, 3, H, W)``; outputs

* backbone (``BackboneForExport``): the pyramid maps, one per output stride, named
  ``stride4``, ``stride8``, ... (``(1, C, H/s, W/s)``);
* segmentor (``SegmentorForExport``): ``seg_logits`` ``(1, K, H, W)``: mmseg's
  ``encode_decode`` (backbone, neck, decode head, bilinear resize to the input), as its
  whole-image inference computes it before cropping and resizing to the original image;
* detector (``DetectorForExport``): mmdeploy's end-to-end layout, ``dets`` ``(1, N, 5)`` (x1, y1,
  x2, y2, score in input pixels), ``labels`` ``(1, N)``, ``masks`` ``(1, N, h, w)`` (the mask
  head's probabilities at RoI resolution); see ``detection.py``.
"""
from typing import List, Tuple

import torch
import torch.nn as nn

from .detection import mask_rcnn_end_to_end

__all__ = ['DetectorForExport', 'wrap_for_export']


class BackboneForExport(nn.Module):
    """A deepvit_mm backbone: ``input`` -> its pyramid maps (``output_names``)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    @property
    def output_names(self) -> List[str]:
        return [f'stride{s}' for s in self.backbone.out_strides]

    def forward(self, input: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.backbone(input))


class SegmentorForExport(nn.Module):
    """An mmseg ``EncoderDecoder``: ``input`` -> ``seg_logits`` at the input's size."""
    output_names = ['seg_logits']

    def __init__(self, segmentor: nn.Module) -> None:
        super().__init__()
        self.segmentor = segmentor

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # the input is what the preprocessor made of the image: its own shape is the img_shape
        return self.segmentor.encode_decode(input, [dict(img_shape=input.shape[2:])])


class DetectorForExport(nn.Module):
    """An mmdet two-stage detector (Mask R-CNN): ``input`` -> ``dets``, ``labels``, ``masks``."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector

    @property
    def output_names(self) -> List[str]:
        with_mask = getattr(self.detector.roi_head, 'with_mask', False)
        return ['dets', 'labels'] + (['masks'] if with_mask else [])

    def forward(self, input: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(mask_rcnn_end_to_end(self.detector, input))


def wrap_for_export(model: nn.Module, task: str, backbone_only: bool = False) -> nn.Module:
    """The export wrapper of a built model (``task``: ``'det'`` or ``'seg'``), in eval mode.

    Raises:
        NotImplementedError: A detector other than a two-stage one with an RPN and a standard
            RoI head (what the exporter's post-processing covers).
    """
    if backbone_only:
        wrapper = BackboneForExport(model.backbone)
    elif task == 'seg':
        wrapper = SegmentorForExport(model)
    else:
        if not (getattr(model, 'with_rpn', False) and hasattr(model, 'roi_head')):
            raise NotImplementedError(
                f'{type(model).__name__}: the exporter covers two-stage detectors with an RPN and '
                'a standard RoI head (Mask R-CNN, Faster R-CNN); use --backbone-only for others')
        wrapper = DetectorForExport(model)
    return wrapper.eval()
