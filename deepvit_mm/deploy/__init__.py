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
from .export import (
           DYNAMIC_MAX,
           DYNAMIC_MIN,
           SIZE_DIVISOR,
           dynamic_range,
           example_input,
           export_onnx,
           load_model,
           onnx_dynamo_export_problem,
           onnxruntime_session,
           run_onnx,
)
from .parity import check_export, max_rel_err
from .wrappers import DetectorForExport, wrap_for_export

__all__ = ['DYNAMIC_MAX', 'DYNAMIC_MIN', 'SIZE_DIVISOR', 'dynamic_range', 'example_input',
           'export_onnx', 'load_model', 'onnx_dynamo_export_problem', 'onnxruntime_session',
           'run_onnx', 'DetectorForExport', 'wrap_for_export', 'check_export', 'max_rel_err']
