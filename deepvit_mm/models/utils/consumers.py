"""Whether the neck or heads that read a columnar backbone were built for its levels.

A columnar backbone (XCiT, CaiT, timm's ViT family) feeds every level with ``embed_dim`` channels,
where the stock mmdet/mmseg configs it is swapped into were written for a ResNet's 256/512/1024/2048
and, for some, for three of its four levels. Built with the stock numbers, the neck or head fails
deep in its forward pass with a convolution's shape error (or a bare ``AssertionError`` for a wrong
number of levels) that does not say which config key to change. ``check_consumers`` compares what
the consumers were built for with what the backbone gives before anything runs, and names the keys.

The consumers read are the ones mmdet 3.x and mmseg 1.x models have: ``model.neck`` when there is
one (any neck with a list ``in_channels``: FPN, PAFPN, ChannelMapper, mmseg's FPN...), otherwise
the heads fed by the backbone directly: mmseg's decode and auxiliary heads (``in_channels``,
``in_index``, ``input_transform``; K-Net's kernel generating head; DeepLabV3+'s stride-4 ``c1``
input; cascades such as OCRNet, whose heads must read one stride) and MaskFormer/Mask2Former
heads (mmdet's and mmseg's, through their pixel decoder). Anything else is not judged.

The check runs before anything else does: ``CheckConsumersHook`` (``deepvit_mm.engine.hooks``,
in every recipe's ``custom_hooks``) before a Runner's run starts, and ``build_from_config`` and
``build_inferencer`` (``deepvit_mm.apis``) once they have built the model, all through
``check_model``; ``check_consumers(model)`` checks a built model. The backbone's forward does not check.
"""
from typing import List, Optional, Sequence

import torch.nn as nn

from ...utils import unwrap_model
from ..backbones import ColumnarBackbone
from ..backbones.columnar_pyramid import PAPER_STRIDES
from ..layers import ConvBase

__all__ = ['ChannelMismatchError', 'check_consumers', 'check_model']


class ChannelMismatchError(ValueError):
    """A neck or head was built for other channels (or levels) than the backbone feeds it."""


def check_model(model: nn.Module) -> None:
    """``check_consumers`` on a model whose backbone is a ``ColumnarBackbone``; other models are
    left alone. The model may be inside mmengine's model wrappers (``MMDistributedDataParallel``...)
    or a test-time augmentation model (``BaseTTAModel``: mmdet's ``DetTTAModel``, mmseg's
    ``SegTTAModel``).

    Args:
        model (nn.Module): A detector or segmentor as mmengine holds it (``runner.model``, an
            inferencer's ``model``).

    Raises:
        ChannelMismatchError: as ``check_consumers``.
    """
    model = unwrap_model(model)
    if isinstance(getattr(model, 'backbone', None), ColumnarBackbone):
        check_consumers(model)


def check_consumers(model: nn.Module) -> None:
    """Raise ``ChannelMismatchError`` when the model's neck or heads do not fit its backbone.

    Args:
        model (nn.Module): A built detector or segmentor; its ``backbone`` has ``out_channels``,
            ``out_strides`` and ``arch``.

    Raises:
        ChannelMismatchError: naming each mismatched module, what it was built for, and the
            config keys that fix it.
    """
    backbone = model.backbone
    channels, strides = list(backbone.out_channels), tuple(backbone.out_strides)
    problems = consumer_problems(model, channels, strides)
    if not problems:
        return
    name = type(backbone).__name__
    raise ChannelMismatchError(
        f"{name}(arch={backbone.arch!r}) feeds {len(channels)} levels of {channels} channels at "
        f'strides {strides} ({name}.feature_levels({backbone.arch!r}, out_strides={strides})), '
        'but the modules that read them were built for others:\n  '
        + '\n  '.join(problems))


def consumer_problems(model: nn.Module, channels: Sequence[int],
                      strides: Optional[Sequence[int]] = None) -> List[str]:
    """One line per consumer of ``model.backbone`` that does not fit ``channels`` and ``strides``
    (per level; default: the backbone's ``out_strides``)."""
    channels = list(channels)
    strides = list(model.backbone.out_strides if strides is None else strides)
    neck = getattr(model, 'neck', None)
    if isinstance(neck, nn.Module):
        consumers = [('model.neck', neck)]
    else:
        consumers = []
        for attr in ('decode_head', 'auxiliary_head', 'panoptic_head'):
            head = getattr(model, attr, None)
            if isinstance(head, nn.ModuleList):  # mmseg's cascades and lists of auxiliary heads
                consumers += [(f'model.{attr}[{i}]', h) for i, h in enumerate(head)]
            elif isinstance(head, nn.Module):
                consumers.append((f'model.{attr}', head))
    problems = []
    for key, module in consumers:
        problems += _problems(key, module, channels)
    heads = getattr(model, 'decode_head', None)
    if not problems and isinstance(heads, nn.ModuleList):
        problems += _cascade_problems(heads, strides)
    return problems


# ---------------------------------------------------------------------------------- per consumer
def _problems(key: str, module: nn.Module, channels: List[int]) -> List[str]:
    what = f'{key} ({type(module).__name__})'
    generator = getattr(module, 'kernel_generate_head', None)  # mmseg's K-Net
    if isinstance(generator, nn.Module):
        return _problems(f'{key}.kernel_generate_head', generator, channels)
    if _is_mmseg_decode_head(module):
        return _decode_head_problems(key, what, module, channels)
    decoder = getattr(module, 'pixel_decoder', None)  # MaskFormer / Mask2Former (mmdet, mmseg)
    if isinstance(decoder, nn.Module):
        built = _pixel_decoder_channels(decoder)
        return [] if built is None else _list_problems(key, what, built, channels, 'in_channels')
    built = getattr(module, 'in_channels', None)
    convs = getattr(module, 'convs', None)
    if built is None and isinstance(convs, nn.ModuleList):  # mmdet's ChannelMapper keeps convs only
        built = [_first_conv_in_channels(c) for c in convs]
    if _is_int_list(built):  # a neck: one entry per backbone level
        used = range(getattr(module, 'start_level', 0),
                     getattr(module, 'backbone_end_level', len(built)))  # FPN reads these
        return _list_problems(key, what, list(built), channels, 'in_channels', used)
    return []


def _list_problems(key: str, what: str, built: List[int], channels: List[int], arg: str,
                   used: Optional[Sequence[int]] = None) -> List[str]:
    n, c = len(channels), channels[0]
    if len(built) != n:
        if len(built) <= len(PAPER_STRIDES):  # the coarsest ones, as 3-level necks read a ResNet
            levels = f'out_strides={PAPER_STRIDES[-len(built):]}'
        else:
            levels = 'out_strides and out_indices (one per entry)'
        return [f'{what}: {arg}={built} reads {len(built)} levels, the backbone gives {n}. Set '
                f'{key}.{arg}={[c] * len(built)} and the backbone\'s {levels}, or '
                f'{key}.{arg}={channels} for all {n} levels (and its other per-level settings).']
    used = range(len(built)) if used is None else used
    if any(built[i] != channels[i] for i in used):
        return [f'{what}: {arg}={built}. Set {key}.{arg}={channels}.']
    return []


def _decode_head_problems(key: str, what: str, head: nn.Module, channels: List[int]) -> List[str]:
    n, index, transform = len(channels), head.in_index, head.input_transform
    indices = _levels(index)
    bad = [i for i in indices if not -n <= i < n]
    if bad:
        return [f'{what}: in_index={index} reads level(s) {bad}, the backbone gives {n} levels '
                f'(0..{n - 1}). Set {key}.in_index to levels that exist (the backbone\'s '
                'out_strides decide which there are).']
    want = [channels[i] for i in indices]
    problems = []
    if transform == 'resize_concat':
        if head.in_channels != sum(want):
            problems.append(f'{what}: concatenates in_index={index} into {head.in_channels} '
                            f'channels, they have {sum(want)}. Set {key}.in_channels={want}.')
    elif transform == 'multiple_select':
        if list(head.in_channels) != want:
            problems.append(f'{what}: in_channels={list(head.in_channels)} for in_index={index}. '
                            f'Set {key}.in_channels={want}.')
    elif head.in_channels != want[0]:
        problems.append(f'{what}: in_channels={head.in_channels} for in_index={index}. '
                        f'Set {key}.in_channels={want[0]}.')
    c1 = getattr(head, 'c1_bottleneck', None)  # DeepLabV3+ also reads level 0 (stride 4)
    if isinstance(c1, nn.Module):
        built = _first_conv_in_channels(c1)
        if built is not None and built != channels[0]:
            problems.append(f'{what}: c1_in_channels={built} for level 0. '
                            f'Set {key}.c1_in_channels={channels[0]}.')
    return problems


def _cascade_problems(heads: nn.ModuleList, strides: List[int]) -> List[str]:
    """mmseg's cascades (OCRNet): a head that gathers the previous head's class map over its own
    input (``spatial_gather_module``) needs both at one stride; at two it fails inside the
    gather with ``Expected size for first two dimensions of batch2 tensor``."""
    problems = []
    for i in range(1, len(heads)):
        head, prev = heads[i], heads[i - 1]
        if not (isinstance(getattr(head, 'spatial_gather_module', None), nn.Module)
                and _is_mmseg_decode_head(prev)):
            continue
        mine, theirs = (_levels(h.in_index)[0] % len(strides) for h in (head, prev))
        if mine != theirs:
            problems.append(
                f'model.decode_head[{i}] ({type(head).__name__}) gathers model.decode_head[{i - 1}]'
                f"'s class map (in_index={prev.in_index}, stride {strides[theirs]}) over its own "
                f'input (in_index={head.in_index}, stride {strides[mine]}): both must read one '
                f'stride. Set model.decode_head[{i}].in_index={theirs} (and its in_channels), or '
                f'give both heads one level.')
    return problems


def _levels(index) -> List[int]:
    """A decode head's ``in_index`` (one level or several) as a list."""
    return list(index) if isinstance(index, (list, tuple)) else [index]


def _is_mmseg_decode_head(module: nn.Module) -> bool:
    try:
        from mmseg.models.decode_heads.decode_head import BaseDecodeHead
    except ImportError:  # mmseg is optional for detection
        return False
    return isinstance(module, BaseDecodeHead)


def _pixel_decoder_channels(decoder: nn.Module) -> Optional[List[int]]:
    """The per-level input channels a MaskFormer/Mask2Former pixel decoder was built for."""
    built = getattr(decoder, 'in_channels', None)  # PixelDecoder, TransformerEncoderPixelDecoder
    if _is_int_list(built):
        return list(built)
    n = getattr(decoder, 'num_input_levels', None)  # MSDeformAttnPixelDecoder keeps only convs:
    if not isinstance(n, int) or not hasattr(decoder, 'input_convs'):
        return None
    levels: List[Optional[int]] = [None] * n
    # input_convs: the last num_encoder_levels levels, coarsest first; lateral_convs: the others,
    # also coarsest first
    for k, conv in enumerate(decoder.input_convs):
        levels[n - 1 - k] = _first_conv_in_channels(conv)
    lower = n - len(decoder.input_convs)
    for k, conv in enumerate(getattr(decoder, 'lateral_convs', [])):
        levels[lower - 1 - k] = _first_conv_in_channels(conv)
    return None if None in levels else levels


def _first_conv_in_channels(module: nn.Module) -> Optional[int]:
    for m in module.modules():
        if isinstance(m, ConvBase):
            return int(m.in_channels)
    return None


def _is_int_list(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and \
        all(isinstance(v, int) and not isinstance(v, bool) for v in value)

