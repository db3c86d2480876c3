"""What a backbone refuses before it runs, with a message that says what to pass instead.

Constructor arguments the trunk would reject with an unhelpful message or accept wrongly
(``check_arguments``; ``check_out_indices``: the taps, one per level), an input the model cannot
take (``check_input``: shape, channels, dtype, size, from the tensor's metadata alone;
``check_finite``: NaN, which reads the values), and the free memory a forward is checked against
(``free_memory``; the estimate of what a forward needs is the family's,
``ColumnarBackbone._activation_bytes``).

Reading a value of a GPU tensor (``check_finite``) or asking the GPU for its free memory waits for
every kernel queued before it: the host cannot run ahead of the GPU. ``ColumnarBackbone`` therefore
calls those two only where they cost nothing in a long run: ``check_finite`` on its first call,
``free_memory`` for an input larger than any it checked before (``FiniteLossHook`` names
non-finite images once a loss is not finite).
"""
import numbers
import os
from typing import Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ...compat.torch import autocast_enabled
from ...tracing import in_graph_capture
from ...version import TESTED

__all__ = []


def check_out_indices(name: str, arch: str, out_indices, depth: int, default: Sequence[int],
                      out_strides: Sequence[int]) -> Tuple[int, ...]:
    """The blocks to tap, as a tuple: 0-based, in ``[0, depth)``, strictly increasing, one per
    output stride; else ``TypeError``/``ValueError`` saying what to pass.

    Args:
        name (str): The backbone's class name; ``arch`` its arch, for the messages.
        out_indices: As given to the backbone (or its default taps).
        depth (int): Blocks of the arch; ``default`` its default taps, named in the message.
        out_strides (Sequence[int]): The output strides, one tap each.
    """
    if isinstance(out_indices, (str, bytes)) or not isinstance(out_indices, Sequence) \
            or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool)
                       for i in out_indices):
        raise TypeError(f'{name}: out_indices must be a sequence of 0-based block indices, one '
                        f'per output stride, e.g. (3, 5, 7, 11); got {out_indices!r}.')
    idx = tuple(int(i) for i in out_indices)
    if not idx or any(i < 0 or i >= depth for i in idx):
        raise ValueError(f'{name}({arch}): out_indices {tuple(out_indices)} must be 0-based block '
                         f'indices in [0, {depth - 1}] (the default is {tuple(default)}).')
    if list(idx) != sorted(set(idx)):
        raise ValueError(f'{name}({arch}): out_indices {idx} must be strictly increasing, e.g. '
                         f'{tuple(sorted(set(idx)))}.')
    if len(idx) != len(out_strides):
        raise ValueError(f'{name}: {len(idx)} out_indices {idx} for {len(out_strides)} out_strides '
                         f'{tuple(out_strides)}: give one tap per level.')
    return idx


def check_arguments(name: str, drop_path_rate, norm_cfg, frozen_stages) -> None:
    """Argument types the trunk would reject with an unhelpful message (or accept wrongly).

    Args:
        name (str): The backbone's class name, for the messages.
        drop_path_rate, norm_cfg, frozen_stages: As given to the backbone.
    """
    if drop_path_rate is not None and (
            not isinstance(drop_path_rate, numbers.Real) or isinstance(drop_path_rate, bool)
            or not 0 <= drop_path_rate < 1):
        raise ValueError(f'{name}: drop_path_rate must be a number in [0, 1) (the probability '
                         f'of skipping a block), got {drop_path_rate!r}; the paper uses '
                         '0.0-0.3.')
    if norm_cfg is not None:
        if not isinstance(norm_cfg, Mapping) or 'type' not in norm_cfg:
            raise TypeError(f"{name}: norm_cfg must be a dict with a 'type', e.g. "
                            "dict(type='BN', requires_grad=True) or dict(type='SyncBN'); got "
                            f'{norm_cfg!r}.')
        if norm_cfg['type'] == 'GN' and 'num_groups' not in norm_cfg:
            raise ValueError(f"{name}: norm_cfg={dict(norm_cfg)} needs num_groups, e.g. "
                             "dict(type='GN', num_groups=32).")
    if not isinstance(frozen_stages, numbers.Integral) or isinstance(frozen_stages, bool):
        raise TypeError(f'{name}: frozen_stages must be an int: -1 (nothing frozen), 0 (patch '
                        'embedding) or k (also the first k blocks; the number of blocks used '
                        f'freezes the whole trunk); got {frozen_stages!r}.')


def check_compile_blocks(name: str, compile_blocks) -> Optional[dict]:
    """``compile_blocks`` as ``torch.compile``'s options: None (off, ``False``), ``{}`` (``True``)
    or the dict given; else ``TypeError`` saying what to pass."""
    if isinstance(compile_blocks, bool):
        return {} if compile_blocks else None
    if isinstance(compile_blocks, Mapping):
        import inspect
        known = set(inspect.signature(torch.compile).parameters) - {'model'}
        unknown = sorted(set(compile_blocks) - known)
        if unknown:
            raise TypeError(f'{name}: compile_blocks={dict(compile_blocks)} has no torch.compile '
                            f'option {", ".join(unknown)}; its options: {", ".join(sorted(known))}.')
        return dict(compile_blocks)
    raise TypeError(f'{name}: compile_blocks must be True, False or a dict of torch.compile\'s '
                    f"options (e.g. dict(mode='max-autotune')), got {compile_blocks!r}.")


def blocks_compile_problem() -> Optional[str]:
    """None if ``torch.compile`` compiles a module in place (``nn.Module.compile``) and traces
    every block's copy of a part as one graph (dynamo's ``inline_inbuilt_nn_modules``, always on in
    the newest tested torch; torch 2.1 has ``nn.Module.compile`` without it), else why not and what
    to do instead (the backbones' ``compile_blocks``)."""
    if hasattr(nn.Module, 'compile'):
        import importlib
        import warnings
        dynamo_config = importlib.import_module('torch._dynamo.config')
        with warnings.catch_warnings():  # deprecated where it is always on
            warnings.simplefilter('ignore', FutureWarning)
            if getattr(dynamo_config, 'inline_inbuilt_nn_modules', False):
                return None
    return (f'torch {torch.__version__} compiles each block\'s copy of a part as a graph of its '
            'own (its dynamo does not inline modules; the time it takes: '
            'docs/training.md#compiling-the-backbone). Leave compile_blocks off here, or use a '
            'torch with nn.Module.compile and torch._dynamo.config.inline_inbuilt_nn_modules '
            f'(torch {TESTED["newest"]["torch"]} is tested).')


def inductor_cache_problem() -> Optional[str]:
    """None unless torch's CPU kernels are capped by ``ATEN_CPU_CAPABILITY`` while
    ``torch.compile``'s kernels go to inductor's shared cache (``TORCHINDUCTOR_CACHE_DIR`` unset),
    else what goes wrong and what to set: the cache's keys do not tell the instruction sets apart,
    so a kernel compiled under another setting is loaded as it is (torch 2.13.0: a compiled timm
    MLP's outputs wrong under ``avx2`` with kernels compiled for AVX-512, and a crashed process
    the other way round; docs/training.md#compiling-the-backbone)."""
    isa = os.environ.get('ATEN_CPU_CAPABILITY', '')
    if not isa or isa == 'default' or os.environ.get('TORCHINDUCTOR_CACHE_DIR'):
        return None
    return (f'ATEN_CPU_CAPABILITY={isa} is set and torch.compile keeps its kernels in inductor\'s '
            'shared cache (TORCHINDUCTOR_CACHE_DIR is unset), whose keys do not tell the '
            'instruction sets apart: a kernel compiled there under another ATEN_CPU_CAPABILITY '
            'is loaded as it is and computes wrong values or crashes the process. Set '
            'TORCHINDUCTOR_CACHE_DIR to a folder of this setting\'s own, e.g. '
            f'/tmp/torchinductor_{isa}.')



def check_input(backbone: nn.Module, x: torch.Tensor) -> None:
    """Refuse, with what to do, an input ``backbone`` (a ``ColumnarBackbone``) cannot take, from
    its metadata (shape, dtype) alone: no value is read, so nothing waits for the device."""
    name = f'{type(backbone).__name__}({backbone.arch})'
    if not torch.is_tensor(x) or x.dim() != 4:
        raise ValueError(f'{name} expects a (B, C, H, W) tensor of images, got '
                         f'{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}.')
    in_chans = backbone.in_chans
    if x.shape[1] != in_chans:
        raise ValueError(f'{name} expects {in_chans}-channel images, got {x.shape[1]} channels '
                         f'(shape {tuple(x.shape)}); convert the images (e.g. to RGB) or set '
                         f'in_chans={x.shape[1]} (pretrained weights then do not fit).')
    weight_dtype = next(backbone.parameters()).dtype
    if not x.is_floating_point():
        raise TypeError(f'{name} expects float images normalised by the data preprocessor '
                        f'(mean/std), got {x.dtype}: use mmdet/mmseg\'s data preprocessor, or '
                        f'(x.float() - mean) / std.')
    if x.dtype != weight_dtype and not autocast_enabled(x.device.type):
        raise TypeError(f'{name}: input is {x.dtype} but the weights are {weight_dtype}: pass '
                        f'x.to({weight_dtype}), convert the model (model.to({x.dtype})), or run '
                        'under torch.autocast for mixed precision.')
    if min(x.shape[-2:]) < backbone.patch_size:
        raise ValueError(f'{name}: input {tuple(x.shape[-2:])} is smaller than one '
                         f'{backbone.patch_size}x{backbone.patch_size} patch; resize images to at least '
                         f'{backbone.patch_size} pixels a side.')
    # unpadded, the coarsest (max-pooled) level needs pad_to/patch_size patches a side
    least = backbone.pad_to - backbone.patch_size + 1
    if not backbone.pad_input and min(x.shape[-2:]) < least:
        raise ValueError(f'{name}: with pad_input=False an input needs at least {least} pixels '
                         f'a side for the stride-{backbone.pad_to} level, got '
                         f'{tuple(x.shape[-2:])}; use pad_input=True or larger images.')


def check_finite(backbone: nn.Module, x: torch.Tensor) -> None:
    """Refuse an input holding NaN or infinite values, which would make every output NaN. Reads
    the values: on a GPU, waits for the kernels queued before it (not on meta tensors, which have
    no values: FLOP counting runs the model on them)."""
    if not in_graph_capture() and x.device.type != 'meta' and x.numel() and not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f'{type(backbone).__name__}({backbone.arch}): the input holds {bad} NaN or '
                         'infinite values, which would make every output NaN. Check the images '
                         'and the data preprocessor (a std of 0, a corrupt file).')


def free_memory(device: torch.device) -> Optional[int]:
    """Bytes a new allocation can take on ``device``, or None when unknown."""
    if device.type == 'cuda':
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == 'cpu':
        try:
            with open('/proc/meminfo') as f:
                info = dict(line.split(':', 1) for line in f)
            return int(info['MemAvailable'].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return None
    return None
