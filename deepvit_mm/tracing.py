"""Whether the model is being captured into a graph, and what kind of graph.

Two questions, asked by the backbones and their ``ColumnarPyramid``:

* ``in_graph_capture()``: any capture (ONNX export, ``torch.export``, TorchScript tracing,
  ``torch.compile``). Checks that read tensor values (a NaN in the input, free memory) are skipped
  there: their result would be frozen into the graph as a constant, or break it.
* ``capturing_for_other_sizes()``: a capture whose graph is then run at other input sizes (ONNX
  export, ``torch.export``, TorchScript tracing), not ``torch.compile``, which re-traces when a
  size changes. Choices taken from the input's size (the ``'auto'`` fast paths, chunk loops) must
  not be taken from the example input there.

Where torch releases differ, the API is picked by what the installed torch has:
``torch.compiler.is_compiling`` (torch 2.3+; 2.1 and 2.2 have ``torch._dynamo.is_compiling``) and
``torch.compiler.is_exporting`` (torch 2.7+; before it, no ``torch.export`` capture is told apart).
"""
import torch

__all__ = ['in_graph_capture', 'capturing_for_other_sizes']


def _is_compiling() -> bool:
    """Inside ``torch.compile``'s (dynamo's) tracing."""
    compiler = getattr(torch, 'compiler', None)
    if compiler is not None and hasattr(compiler, 'is_compiling'):
        return compiler.is_compiling()
    return torch._dynamo.is_compiling()  # torch 2.1, 2.2


def _is_exporting() -> bool:
    """Inside ``torch.export`` (which ``torch.onnx.export(dynamo=True)`` runs)."""
    fn = getattr(getattr(torch, 'compiler', None), 'is_exporting', None)  # torch >= 2.7
    return bool(fn is not None and fn())


def capturing_for_other_sizes() -> bool:
    """ONNX export, ``torch.export`` or TorchScript tracing (see the module docstring)."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or _is_exporting()


def in_graph_capture() -> bool:
    """``capturing_for_other_sizes()`` or ``torch.compile`` (see the module docstring)."""
    return capturing_for_other_sizes() or _is_compiling()
