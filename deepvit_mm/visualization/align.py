"""A map computed on the padded network input, laid over the original image.

mmdet's and mmseg's test pipelines resize an image (``ori_shape`` -> ``img_shape``) and their data
preprocessors pad it at the bottom and right (-> ``pad_shape``, e.g. to a multiple of 32). A map
of the network (a pyramid level, an attention map over the patch grid) covers the padded input, so
stretching the whole map over the image would shift and squash it by the padding: mmyolo's
``featmap_vis_demo.py`` does so and its docs say the maps are misaligned. Here a map is first
cropped to the cells that see the image (its valid region), then resized to the original image.

Each axis is treated on its own, from the map's actual height and width: a map of ``h x w`` cells
over a ``pad_h x pad_w`` input has strides ``pad_h / h`` and ``pad_w / w``; no square grid is
assumed.
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ['valid_grid', 'align_to_image']


def _hw(shape: Sequence[int], name: str) -> Tuple[int, int]:
    if shape is None or len(shape) < 2:
        raise ValueError(f'{name} {shape!r}: give (height, width)')
    h, w = int(shape[0]), int(shape[1])
    if h < 1 or w < 1:
        raise ValueError(f'{name} {shape!r}: height and width must be positive')
    return h, w


def valid_grid(grid_shape: Sequence[int], img_shape: Sequence[int],
               pad_shape: Optional[Sequence[int]] = None) -> Tuple[int, int]:
    """The cells of a map that see the image rather than the padding.

    Args:
        grid_shape (Sequence[int]): The map's ``(h, w)``.
        img_shape (Sequence[int]): ``(H, W)`` of the resized image, before padding (the data
            sample's ``img_shape``).
        pad_shape (Sequence[int], optional): ``(H, W)`` of the padded input the map was computed
            on (the data sample's ``pad_shape``). Default: None (no padding: ``img_shape``).

    Returns:
        tuple[int, int]: ``(ceil(H / stride_h), ceil(W / stride_w))`` with ``stride_h = pad_H / h``
        and ``stride_w = pad_W / w``, at least 1 and at most ``(h, w)``.

    Raises:
        ValueError: a shape that is not a positive ``(height, width)``, or an image larger than
            its padded input.
    """
    h, w = _hw(grid_shape, 'grid_shape')
    img_h, img_w = _hw(img_shape, 'img_shape')
    pad_h, pad_w = _hw(pad_shape, 'pad_shape') if pad_shape is not None else (img_h, img_w)
    if img_h > pad_h or img_w > pad_w:
        raise ValueError(f'img_shape {(img_h, img_w)} is larger than pad_shape {(pad_h, pad_w)}: '
                         'img_shape is the image before padding, pad_shape after')
    # img / stride = img * cells / pad; the small tolerance keeps an exact multiple exact
    vh = math.ceil(img_h * h / pad_h - 1e-6)
    vw = math.ceil(img_w * w / pad_w - 1e-6)
    return min(max(vh, 1), h), min(max(vw, 1), w)


def align_to_image(maps: torch.Tensor, img_shape: Sequence[int],
                   pad_shape: Optional[Sequence[int]], ori_shape: Sequence[int],
                   mode: str = 'bilinear') -> torch.Tensor:
    """A map (or a stack of maps) of the padded network input, at the original image's size.

    The map is cropped to its valid cells (``valid_grid``); those cells cover
    ``valid * stride`` pixels of the resized image, a little more than ``img_shape`` where the
    image's size is not a multiple of the stride, so they are resized to that many pixels, the
    image's ``img_shape`` is cut from it, and that is resized to ``ori_shape``: every cell lands on
    the pixels of the original image it was computed from.

    Args:
        maps (torch.Tensor): ``(C, h, w)`` or ``(h, w)``, over the padded input.
        img_shape (Sequence[int]): ``(H, W)`` of the resized image before padding.
        pad_shape (Sequence[int], optional): ``(H, W)`` of the padded input. None: no padding.
        ori_shape (Sequence[int]): ``(H, W)`` of the original image.
        mode (str): ``torch.nn.functional.interpolate``'s mode. Default: ``'bilinear'``.

    Returns:
        torch.Tensor: float32, ``(C, *ori_shape)`` or ``ori_shape``, as ``maps`` was given.

    Raises:
        ValueError: ``maps`` not 2-D or 3-D; a shape as ``valid_grid`` refuses it.
    """
    if maps.dim() not in (2, 3):
        raise ValueError(f'maps of shape {tuple(maps.shape)}: give (C, h, w) or (h, w)')
    squeeze = maps.dim() == 2
    x = maps.detach().float()[None] if squeeze else maps.detach().float()
    h, w = x.shape[-2:]
    img_h, img_w = _hw(img_shape, 'img_shape')
    pad_h, pad_w = _hw(pad_shape, 'pad_shape') if pad_shape is not None else (img_h, img_w)
    ori_h, ori_w = _hw(ori_shape, 'ori_shape')
    vh, vw = valid_grid((h, w), (img_h, img_w), (pad_h, pad_w))
    x = x[:, :vh, :vw]
    # the valid cells' extent in pixels of the resized image (pad / cells is the stride)
    cover_h = max(round(vh * pad_h / h), img_h)
    cover_w = max(round(vw * pad_w / w), img_w)
    kw = dict(align_corners=False) if mode in ('bilinear', 'bicubic') else {}
    x = F.interpolate(x[None], size=(cover_h, cover_w), mode=mode, **kw)[0]
    x = x[:, :img_h, :img_w]
    if (img_h, img_w) != (ori_h, ori_w):
        x = F.interpolate(x[None], size=(ori_h, ori_w), mode=mode, **kw)[0]
    return x[0] if squeeze else x
