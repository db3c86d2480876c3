"""Deployment: ONNX export of the models the Runner trains, and ONNX Runtime inference.

* ``wrappers``: the export contract (one ``input`` tensor; backbone maps, ``seg_logits``, or
  ``dets`` / ``labels`` / ``masks``) around the Runner's own modules;
* ``detection``: Mask R-CNN's test-time post-processing in ops that export to standard ONNX;
* ``layers``: export forms of the head layers whose forward would freeze the input size;
* ``export``: building a config's model with its checkpoint, ``torch.onnx`` export (fixed or
  dynamic size; ``onnx_dynamo_export_problem``: whether this torch can), ONNX Runtime sessions;
* ``parity``: exported outputs against PyTorch's (relative error, detection matching).

``tools/deploy/`` calls these (``tools/analysis/benchmark_onnx.py`` times ONNX Runtime against
PyTorch); docs/deployment.md says how, and how fast.
"""
from .detection import mask_rcnn_end_to_end
from .export import (
    DEFAULT_OPSET,
    DYNAMIC_MAX,
    DYNAMIC_MIN,
    SIZE_DIVISOR,
    dynamic_range,
    example_input,
    export_onnx,
    load_model,
    onnx_dynamo_export_problem,
    onnxruntime_session,
    require,
    run_onnx,
)
from .layers import export_forms
from .parity import check_export, match_detections, max_rel_err
from .wrappers import BackboneForExport, DetectorForExport, SegmentorForExport, wrap_for_export

__all__ = ['mask_rcnn_end_to_end', 'DEFAULT_OPSET', 'DYNAMIC_MAX', 'DYNAMIC_MIN', 'SIZE_DIVISOR',
           'dynamic_range', 'example_input', 'export_onnx', 'load_model', 'onnx_dynamo_export_problem',
           'onnxruntime_session', 'require',
           'run_onnx', 'BackboneForExport', 'DetectorForExport', 'SegmentorForExport',
           'wrap_for_export', 'export_forms', 'check_export', 'match_detections', 'max_rel_err']
