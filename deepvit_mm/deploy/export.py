"""ONNX export of a config's model (or its backbone) and running the result in ONNX Runtime.

Exporter: ``torch.onnx.export(dynamo=True)``, i.e. ``torch.export`` then onnxscript's translation
to standard ONNX ops (opset 18 by default); no custom ONNX ops, so any ONNX runtime runs the
files. mmdeploy 1.3.1 (its last release) is not used: it needs ``protobuf<=3.20.2`` (current onnx
needs >= 6), and its rewrites call TorchScript-exporter internals that torch 2.13 no longer has
(``symbolic_opset9._cast_Long``); see docs/deployment.md.

``--dynamic`` (``dynamic=True``): one file for any input whose height and width are multiples of
``SIZE_DIVISOR`` in ``[DYNAMIC_MIN, DYNAMIC_MAX]`` (``dynamic_range``: windowed CaiT from 256).
Multiples of 32 because that is what the
data preprocessors of the recipes pad to and what the backbones pad to themselves: on such inputs
no padding branch depends on the size. Inside that range the graph has no size-dependent Python
branch left: the backbones skip their value checks while exporting and take fixed choices where
their ``'auto'`` fast paths (``gram_xca``, ``query_chunks``) would decide per input
(``deepvit_mm/models/backbones/xcit/fast.py``, ``cait/window_attention.py``, ``cait/model.py``'s
position embedding), and the heads' layers that would freeze it run their export forms
(``layers.py``: mmseg's ``Upsample``, ``AdaptiveAvgPool2d``).
"""
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from ..compat.torch import TORCH_VERSION
from ..version import FEATURE_FLOORS, release
from .layers import export_forms

__all__ = ['SIZE_DIVISOR', 'DYNAMIC_MIN', 'DYNAMIC_MAX', 'dynamic_range', 'load_model',
           'export_onnx', 'onnxruntime_session', 'run_onnx', 'example_input',
           'onnx_dynamo_export_problem']

SIZE_DIVISOR = 32
DYNAMIC_MIN = 64
DYNAMIC_MAX = 2048
# 18: ONNX Resize with antialias (CaiT's position embedding when it shrinks); RoiAlign is opset 16's
DEFAULT_OPSET = 18


def onnx_dynamo_export_problem() -> Optional[str]:
    """None if ONNX export works with this torch, else what to do instead. By version
    (``FEATURE_FLOORS['ONNX export']``), not by feature: torch 2.5.1 has
    ``torch.onnx.export(dynamo=True)`` and fails on these models; torch 2.1 has no dynamo
    exporter."""
    _, lowest, known = FEATURE_FLOORS['ONNX export']
    if TORCH_VERSION >= release(lowest).release:
        return None
    return (f'ONNX export uses torch.onnx.export(dynamo=True) (torch.export and onnxscript) and is '
            f'tested with torch {lowest}; torch {torch.__version__} cannot export these models '
            f'({known}). Export from an environment set up with requirements/constraints.txt '
            '(`make setup`); the exported .onnx file runs anywhere ONNX Runtime does.')


def require(module: str):
    """Import ``module`` (``onnx``, ``onnxruntime``, ``onnxscript``), or say how to install it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f'{module} is needed for ONNX export/inference: pip install -e '
                          f'".[deploy]" (versions in requirements/constraints.txt)') from e


def load_model(config: str, checkpoint: Optional[str] = None, cfg_options: Optional[dict] = None,
               backbone_only: bool = False) -> Tuple[nn.Module, str]:
    """Build ``config``'s model as the Runner does (SyncBN reverted to BN) and load ``checkpoint``
    through deepvit_mm's safe loader, in eval mode.

    The whole model must load from ``checkpoint`` (as ``tools/test.py`` requires); with
    ``backbone_only``, anything the backbone's ``init_cfg`` takes (classification, timm, detector
    or segmentor checkpoints).

    Args:
        config (str): An mmdet or mmseg config with a deepvit_mm backbone.
        checkpoint (str, optional): A trained model's checkpoint (``.pth``, ``.safetensors``, an
            ``http(s)://`` URL). None: random weights.
        cfg_options (dict, optional): Config overrides.
        backbone_only (bool): Only the backbone will be exported. Default: False.

    Returns:
        tuple[nn.Module, str]: the model and its task (``'det'`` or ``'seg'``).
    """
    from ..apis.config import build_from_config, load_config
    from ..checkpoints import load_weights, read_checkpoint, resolve_checkpoint
    model, task = build_from_config(load_config(config, cfg_options))
    if checkpoint is not None:
        path = resolve_checkpoint(checkpoint)
        if backbone_only:
            model.backbone.load_pretrained(path)
        else:
            load_weights(model, read_checkpoint(path), source=repr(checkpoint),
                         require_complete=True)
    return model.eval(), task


def example_input(shape: Sequence[int], seed: int = 0, batch: int = 1) -> torch.Tensor:
    """A ``(batch, 3, H, W)`` batch of standard-normal pixels (a normalised image's statistics),
    the same for the same ``seed``."""
    return torch.randn(batch, 3, *shape, generator=torch.Generator().manual_seed(seed))


def dynamic_range(wrapper: nn.Module) -> Tuple[int, int]:
    """The sizes (each of H and W, multiples of ``SIZE_DIVISOR``) a ``--dynamic`` export of
    ``wrapper`` accepts: ``[DYNAMIC_MIN, DYNAMIC_MAX]``, except that a CaiT or ViT with windowed
    attention needs more than one window a side (from ``window_size * patch_size + 1`` pixels,
    e.g. 256 for 14-patch windows at /16): a grid that fits in one window is attended globally,
    without padding, a different computation the graph cannot switch to."""
    from ..models.backbones import ColumnarBackbone
    lo = DYNAMIC_MIN
    for m in wrapper.modules():
        if isinstance(m, ColumnarBackbone) and getattr(m, 'window_size', 0):
            least = m.window_size * m.patch_size + 1
            lo = max(lo, -(-least // SIZE_DIVISOR) * SIZE_DIVISOR)
    return lo, DYNAMIC_MAX


def _check_dynamic_shape(shape: Sequence[int], lo: int, hi: int) -> None:
    h, w = shape
    if any(s % SIZE_DIVISOR or not lo <= s <= hi for s in (h, w)):
        raise ValueError(f'--dynamic: the example shape {h}x{w} must be multiples of '
                         f'{SIZE_DIVISOR} in [{lo}, {hi}] (the range the file will accept)')


def export_onnx(wrapper: nn.Module, out: str, shape: Sequence[int] = (512, 512),
                dynamic: bool = False, opset: int = DEFAULT_OPSET) -> str:
    """Export an export wrapper (``wrappers.wrap_for_export``) to ``out`` and check the file.

    Args:
        wrapper (nn.Module): ``BackboneForExport``, ``SegmentorForExport`` or
            ``DetectorForExport``.
        out (str): The ``.onnx`` file written.
        shape (Sequence[int]): Input ``(H, W)`` of the example: the only size the file accepts
            without ``dynamic``; with it, a square one is traced 32 px wider (see below).
            Default: (512, 512).
        dynamic (bool): Height and width become graph inputs: any multiples of ``SIZE_DIVISOR``
            in ``dynamic_range(wrapper)`` (``[DYNAMIC_MIN, DYNAMIC_MAX]``, or from 256 for
            windowed CaiT). Default: False.
        opset (int): ONNX opset. Default: ``DEFAULT_OPSET`` (18).

    Returns:
        str: ``out``.
    """
    problem = onnx_dynamo_export_problem()
    if problem:
        raise RuntimeError(problem)
    onnx = require('onnx')
    require('onnxscript')
    shape = tuple(int(s) for s in shape)
    dynamic_shapes = None
    if dynamic:
        from torch.export import Dim
        lo, hi = dynamic_range(wrapper)
        _check_dynamic_shape(shape, lo, hi)
        dynamic_shapes = {'input': {
            2: SIZE_DIVISOR * Dim('h32', min=lo // SIZE_DIVISOR, max=hi // SIZE_DIVISOR),
            3: SIZE_DIVISOR * Dim('w32', min=lo // SIZE_DIVISOR, max=hi // SIZE_DIVISOR)}}
        if shape[0] == shape[1]:
            # reason: torch.export takes two dims of equal example size to be the same symbol
            # ("duck shaping"); the graph would then assume H == W and fail on other inputs
            w = shape[1] + SIZE_DIVISOR
            shape = (shape[0], w if w <= hi else shape[1] - SIZE_DIVISOR)
    wrapper.eval()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with torch.no_grad(), export_forms(wrapper):
        program = torch.onnx.export(
            wrapper, (example_input(shape),), dynamo=True, opset_version=opset,
            input_names=['input'], output_names=list(wrapper.output_names),
            dynamic_shapes=dynamic_shapes, optimize=True, verbose=False)
    program.save(out)
    onnx.checker.check_model(out)
    return out


def onnxruntime_session(path: str, threads: int = 0):
    """An ONNX Runtime CPU session of ``path`` with all graph optimisations; ``threads`` > 0 sets
    its intra-op threads (0: ONNX Runtime's default, one per core)."""
    ort = require('onnxruntime')
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads > 0:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def run_onnx(session, x: torch.Tensor) -> List[np.ndarray]:
    """The session's outputs on ``x`` (a ``(1, 3, H, W)`` float32 tensor), in output order."""
    return session.run(None, {'input': x.detach().cpu().numpy().astype(np.float32)})
