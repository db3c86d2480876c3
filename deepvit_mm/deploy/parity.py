"""How close an exported model's outputs are to PyTorch's.

* maps (backbone levels, ``seg_logits``): ``max_rel_err``, the largest
  ``max|output - reference| / max|reference|`` over the outputs (the measuring harness's too);
* detections: ``match_detections`` pairs each PyTorch box above a score threshold with an
  exported one of the same label and IoU above a threshold (one-to-one, best IoU first).
"""
from typing import Dict, List, Sequence

import torch

__all__ = ['max_rel_err', 'check_export']


def max_rel_err(reference: Sequence[torch.Tensor], outputs: Sequence) -> float:
    """Largest relative difference of ``outputs`` (tensors or arrays) from ``reference`` (same
    order and shapes): the max over outputs of ``max|output - reference| / max|reference|``, each
    relative to its own reference's scale."""
    if len(reference) != len(outputs):
        raise ValueError(f'{len(outputs)} outputs for {len(reference)} reference tensors')
    for r, o in zip(reference, outputs):
        if tuple(r.shape) != tuple(o.shape):
            raise ValueError(f'output shape {tuple(o.shape)} != the reference\'s {tuple(r.shape)}')
    return max(float((torch.as_tensor(o).float() - r.float()).abs().max()
                     / r.float().abs().max().clamp_min(1e-12)) for r, o in zip(reference, outputs))


def match_detections(ref_boxes: torch.Tensor, ref_scores: torch.Tensor, ref_labels: torch.Tensor,
                     boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor,
                     score_thr: float = 0.3, iou_thr: float = 0.95) -> Dict[str, object]:
    """Match the reference detections above ``score_thr`` with the others above it.

    Args:
        ref_boxes, ref_scores, ref_labels: PyTorch's ``(n, 4)`` boxes, ``(n,)`` scores, labels.
        boxes, scores, labels: the exported model's.
        score_thr (float): Detections compared: score above this. Default: 0.3.
        iou_thr (float): A pair matches with the same label and IoU above this. Default: 0.95.

    Returns:
        dict: ``reference`` and ``exported`` (counts above ``score_thr``), ``matched`` (pairs),
        ``min_iou`` of the matched pairs (1.0 when none), ``pairs`` (index pairs into the
        thresholded reference and exported detections).
    """
    from torchvision.ops import box_iou
    keep_r, keep_o = ref_scores > score_thr, scores > score_thr
    rb, rl = ref_boxes[keep_r].float(), ref_labels[keep_r]
    ob, ol = boxes[keep_o].float(), labels[keep_o]
    iou = box_iou(rb, ob) if len(rb) and len(ob) else torch.zeros(len(rb), len(ob))
    iou = torch.where(rl[:, None] == ol[None, :], iou, torch.zeros_like(iou))
    pairs, ious = [], []
    while iou.numel() and float(iou.max()) > iou_thr:
        i, j = divmod(int(iou.argmax()), iou.shape[1])
        pairs.append((i, j))
        ious.append(float(iou[i, j]))
        iou[i, :] = 0
        iou[:, j] = 0
    return dict(reference=len(rb), exported=len(ob), matched=len(pairs),
                min_iou=min(ious) if ious else 1.0, pairs=pairs)


def check_export(wrapper: torch.nn.Module, session, shapes: Sequence[Sequence[int]],
                 seed: int = 1) -> List[dict]:
    """Run ``wrapper`` (PyTorch, eager) and ``session`` (its export in ONNX Runtime) on the same
    random input at each ``(H, W)`` of ``shapes``.

    Returns:
        list[dict]: per shape, ``shape`` and, for maps, ``max_rel_err``; for a detector (whose
        outputs on a random image are compared in full: score threshold 0, IoU 0.95),
        ``match_detections``'s counts.
    """
    from .export import example_input, run_onnx
    from .wrappers import DetectorForExport
    rows = []
    for shape in shapes:
        x = example_input(shape, seed)
        with torch.no_grad():
            ref = wrapper(x)
        ref = tuple(ref) if isinstance(ref, (tuple, list)) else (ref,)
        out = run_onnx(session, x)
        row = dict(shape=tuple(shape))
        if isinstance(wrapper, DetectorForExport):
            dets, labels = torch.as_tensor(out[0])[0], torch.as_tensor(out[1])[0]
            m = match_detections(ref[0][0, :, :4], ref[0][0, :, 4], ref[1][0], dets[:, :4],
                                 dets[:, 4], labels, score_thr=0.0)
            row.update({k: v for k, v in m.items() if k != 'pairs'})
        else:
            row['max_rel_err'] = max_rel_err(ref, out)
        rows.append(row)
    return rows
