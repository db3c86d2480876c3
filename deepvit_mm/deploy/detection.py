"""Mask R-CNN's test-time post-processing in ops that export to standard ONNX.

mmdet's ``predict`` path of a two-stage detector branches on data (``if inds.numel() > 0``, empty
results), loops over RoI levels with boolean indexing and calls mmcv's compiled ``RoIAlign`` and
``nms``, which ``torch.export`` cannot trace. The functions here compute the same results from the
same modules (the detector's ``extract_feat``, ``rpn_head``, ``bbox_head``, ``mask_head``, their
anchor generators, box coders and test configs) with:

* torchvision's ``nms`` and ``roi_align``, exported as ONNX ``NonMaxSuppression`` and
  ``RoiAlign`` (opset 16+, ``coordinate_transformation_mode='half_pixel'`` for mmcv's
  ``aligned=True``, the same sampling rule);
* mmcv's ``batched_nms`` as its own coordinate trick (boxes of each class or level shifted apart,
  one NMS), which is what mmcv runs below 10,000 boxes;
* each RoI's features computed on every FPN level and the one ``map_roi_levels`` assigns kept
  (``torch.where``), instead of per-level boolean indexing.

Data-dependent sizes (the boxes left after the score threshold and NMS) stay dynamic in the
exported graph. What is left out of the graph: the rescale to the original image and the pasting
of the ``28x28`` masks into the image, as in mmdeploy's end-to-end layout.
"""
from typing import List, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

__all__ = []


def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """mmcv's ``batched_nms`` (not class-agnostic): NMS within each ``idxs`` group, by shifting
    each group's boxes by ``idx * (max coordinate + 1)`` and running one NMS.

    Returns:
        Tensor: kept indices, in decreasing score order (int64).
    """
    from torchvision.ops import nms
    offsets = idxs.to(boxes) * (boxes.max() + 1)
    return nms(boxes + offsets[:, None], scores, iou_threshold)


def clip_boxes(boxes: Tensor, height, width) -> Tensor:
    """Clamp ``(..., 4)`` boxes to ``[0, width] x [0, height]`` (mmdet's ``clip_border``)."""
    x = boxes[..., 0::2].clamp(min=0, max=width)
    y = boxes[..., 1::2].clamp(min=0, max=height)
    return torch.stack([x[..., 0], y[..., 0], x[..., 1], y[..., 1]], dim=-1)


def roi_features(extractor: nn.Module, feats: Sequence[Tensor], rois: Tensor) -> Tensor:
    """mmdet's ``SingleRoIExtractor(feats, rois)`` without data-dependent indexing.

    Args:
        extractor (nn.Module): mmdet's ``SingleRoIExtractor`` with mmcv ``RoIAlign`` layers.
        feats (Sequence[Tensor]): FPN maps, finest first.
        rois (Tensor): ``(n, 5)``: batch index, x1, y1, x2, y2 in input pixels.

    Returns:
        Tensor: ``(n, C, h, w)``.
    """
    from torchvision.ops import roi_align
    num = extractor.num_inputs
    if getattr(extractor, 'roi_scale_factor', None) or getattr(extractor, 'gc_context', False):
        raise NotImplementedError('roi_scale_factor / gc_context of the RoI extractor are not '
                                  'supported by the exporter')
    level = extractor.map_roi_levels(rois, num)
    out = None
    for i, layer in enumerate(extractor.roi_layers[:num]):
        if getattr(layer, 'pool_mode', 'avg') != 'avg':
            raise NotImplementedError(f'RoIAlign pool_mode={layer.pool_mode!r}: only avg exports')
        f = roi_align(feats[i], rois, output_size=tuple(layer.output_size),
                      spatial_scale=float(layer.spatial_scale),
                      sampling_ratio=int(layer.sampling_ratio), aligned=bool(layer.aligned))
        out = f if out is None else torch.where((level == i).view(-1, 1, 1, 1), f, out)
    return out


def rpn_proposals(rpn_head: nn.Module, feats: Sequence[Tensor], cfg, height, width) -> Tensor:
    """``RPNHead.predict_by_feat`` for one image: ``(n, 5)`` proposals (x1, y1, x2, y2, score),
    at most ``cfg.max_per_img``, in decreasing score order.

    Per level the ``cfg.nms_pre`` best anchors, decoded by the head's box coder and clipped to the
    input; boxes not larger than ``cfg.min_bbox_size`` dropped; NMS within each level.
    """
    from mmdet.structures.bbox import get_box_tensor  # mmdet models only: seg exports go without
    if not rpn_head.use_sigmoid_cls:
        raise NotImplementedError('the exporter supports sigmoid RPN classifiers only')
    cls_scores, bbox_preds = rpn_head(feats)
    sizes = [c.shape[-2:] for c in cls_scores]
    priors = rpn_head.prior_generator.grid_priors(sizes, dtype=cls_scores[0].dtype,
                                                  device=cls_scores[0].device)
    nms_pre = cfg.get('nms_pre', -1)
    all_scores, all_deltas, all_priors, all_levels = [], [], [], []
    for lvl, (cls, reg, pri) in enumerate(zip(cls_scores, bbox_preds, priors)):
        scores = cls[0].permute(1, 2, 0).reshape(-1).sigmoid()
        deltas = reg[0].permute(1, 2, 0).reshape(-1, rpn_head.bbox_coder.encode_size)
        if nms_pre > 0:  # mmdet: sorted, the first nms_pre (all when fewer)
            scores, idx = scores.topk(torch.sym_min(nms_pre, scores.shape[0]))
            deltas, pri = deltas[idx], pri[idx]
        all_scores.append(scores)
        all_deltas.append(deltas)
        all_priors.append(pri)
        all_levels.append(torch.full_like(scores, lvl, dtype=torch.long))
    scores, levels = torch.cat(all_scores), torch.cat(all_levels)
    boxes = get_box_tensor(rpn_head.bbox_coder.decode(torch.cat(all_priors), torch.cat(all_deltas)))
    boxes = clip_boxes(boxes, height, width)
    min_size = cfg.get('min_bbox_size', -1)
    if min_size >= 0:
        wh = boxes[:, 2:] - boxes[:, :2]
        valid = (wh[:, 0] > min_size) & (wh[:, 1] > min_size)
        boxes, scores, levels = boxes[valid], scores[valid], levels[valid]
    keep = batched_nms(boxes, scores, levels, cfg.nms.iou_threshold)[:cfg.max_per_img]
    return torch.cat([boxes[keep], scores[keep, None]], dim=1)


def bbox_detections(roi_head: nn.Module, feats: Sequence[Tensor], proposals: Tensor, cfg,
                    height, width) -> Tuple[Tensor, Tensor]:
    """``StandardRoIHead.predict_bbox`` for one image, without rescaling.

    Returns:
        tuple[Tensor, Tensor]: ``dets`` ``(n, 5)`` (x1, y1, x2, y2, score; decreasing score) and
        ``labels`` ``(n,)``, at most ``cfg.max_per_img``.
    """
    from mmdet.structures.bbox import get_box_tensor
    head = roi_head.bbox_head
    if getattr(head, 'custom_cls_channels', False):
        raise NotImplementedError('bbox heads with custom classifier channels do not export')
    rois = torch.cat([proposals.new_zeros(proposals.shape[0], 1), proposals[:, :4]], dim=1)
    cls_score, bbox_pred = head(roi_features(roi_head.bbox_roi_extractor, feats, rois))
    scores = F.softmax(cls_score, dim=-1)
    boxes = get_box_tensor(head.bbox_coder.decode(proposals[:, :4], bbox_pred))
    num_classes = scores.shape[1] - 1
    boxes = clip_boxes(boxes.reshape(boxes.shape[0], -1, 4), height, width)
    if boxes.shape[1] == 1:  # class-agnostic regression
        boxes = boxes.expand(-1, num_classes, 4)
    scores = scores[:, :num_classes]
    labels = torch.arange(num_classes, device=scores.device).view(1, -1).expand_as(scores)
    boxes, scores, labels = boxes.reshape(-1, 4), scores.reshape(-1), labels.reshape(-1)
    valid = scores > cfg.score_thr
    boxes, scores, labels = boxes[valid], scores[valid], labels[valid]
    keep = batched_nms(boxes, scores, labels, cfg.nms.iou_threshold)
    if cfg.max_per_img > 0:
        keep = keep[:cfg.max_per_img]
    return torch.cat([boxes[keep], scores[keep, None]], dim=1), labels[keep]


def mask_probabilities(roi_head: nn.Module, feats: Sequence[Tensor], dets: Tensor,
                       labels: Tensor) -> Tensor:
    """The mask head's ``(n, h, w)`` probabilities (sigmoid) of each detection's class, at RoI
    resolution (mmdeploy's layout; pasting into the image is left to the caller)."""
    rois = torch.cat([dets.new_zeros(dets.shape[0], 1), dets[:, :4]], dim=1)
    pred = roi_head.mask_head(roi_features(roi_head.mask_roi_extractor, feats, rois))
    if pred.shape[1] == 1:  # class-agnostic masks
        pred = pred[:, 0]
    else:
        pred = pred[torch.arange(pred.shape[0], device=pred.device), labels]
    return pred.sigmoid()


def mask_rcnn_end_to_end(detector: nn.Module, inputs: Tensor) -> List[Tensor]:
    """A two-stage mmdet detector (Mask R-CNN, or Faster R-CNN without masks) on one image.

    Args:
        detector (nn.Module): mmdet ``TwoStageDetector`` with an RPN and a ``StandardRoIHead``.
        inputs (Tensor): ``(1, 3, H, W)``, after the data preprocessor.

    Returns:
        list[Tensor]: ``dets`` ``(1, n, 5)``, ``labels`` ``(1, n)`` and, with a mask head,
        ``masks`` ``(1, n, h, w)``; boxes in input pixels.
    """
    height, width = inputs.shape[-2:]
    feats = detector.extract_feat(inputs)
    cfg = detector.test_cfg
    proposals = rpn_proposals(detector.rpn_head, feats, cfg.rpn, height, width)
    roi_head = detector.roi_head
    dets, labels = bbox_detections(roi_head, feats, proposals, cfg.rcnn, height, width)
    out = [dets[None], labels[None]]
    if getattr(roi_head, 'with_mask', False):
        out.append(mask_probabilities(roi_head, feats, dets, labels)[None])
    return out
