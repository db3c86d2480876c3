"""Whether the model is being captured into a graph, and what kind of graph.

Two questions, asked by the backbones and their ``ColumnarPyramid``:

* ``in_graph_capture()``: any capture (ONNX export, ``torch.export``, TorchScript tracing,
  ``torch.compile``). Checks that read tensor values (a NaN in the input, free memory) are skipped
  there: their result would be frozen into the graph as a constant, or break it.
* ``capturing_for_other_sizes()``: a capture whose graph is then run at other input sizes (ONNX
  export, ``torch.export``, TorchScript tracing), not ``torch.compile``, which re-traces when a
  size changes. Choices taken from the input's size (the ``'auto'`` fast paths, chunk loops) must
  not be taken from the example input there.
"""
import torch

from .compat.torch import is_compiling, is_exporting

__all__ = ['in_graph_capture', 'capturing_for_other_sizes']


def capturing_for_other_sizes() -> bool:
    """ONNX export, ``torch.export`` or TorchScript tracing (see the module docstring)."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or is_exporting()


def in_graph_capture() -> bool:
    """``capturing_for_other_sizes()`` or ``torch.compile`` (see the module docstring)."""
    return capturing_for_other_sizes() or is_compiling()
