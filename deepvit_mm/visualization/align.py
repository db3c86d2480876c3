"""A map computed on the padded network input, laid over the original image.

mmdet's and mmseg's test pipelines resize an image (``ori_shape`` -> ``img_shape``) and their data
preprocessors pad it at the bottom and right (-> ``pad_shape``, e.g. to a multiple of 32). A map
of the network (a pyramid level, an attention map over the patch grid) covers the padded input, so
stretching the whole map over the image would shift and squash it by the padding: mmyolo's
``featmap_vis_demo.py`` does so and its docs say the maps are misaligned. Here a map is first
cropped to the cells that see the image (its valid region), then resized to the original image.

Each axis is treated on its own, from the map's actual height and width: a map of ``h x w`` cells
over a ``pad_h x pad_w`` input has strides ``pad_h / h`` and ``pad_w / w``, unless the caller knows
the strides (a backbone that pads further inside, as BEiT pads to its position grid, has more
cells than the input it was given); no square grid is assumed.
"""
import math
from typing import Optional, Sequence, Tuple, Union

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


Stride = Union[float, Tuple[float, float]]


def _strides(stride: Optional[Stride], grid: Tuple[int, int],
             pad: Tuple[int, int]) -> Tuple[float, float]:
    if stride is None:
        return pad[0] / grid[0], pad[1] / grid[1]
    sy, sx = (stride, stride) if isinstance(stride, (int, float)) else stride
    if not (sy > 0 and sx > 0):
        raise ValueError(f'stride {stride!r}: give a positive stride or (stride_h, stride_w)')
    return float(sy), float(sx)


def valid_grid(grid_shape: Sequence[int], img_shape: Sequence[int],
               pad_shape: Optional[Sequence[int]] = None,
               stride: Optional[Stride] = None) -> Tuple[int, int]:
    """The cells of a map that see the image rather than the padding.

    Args:
        grid_shape (Sequence[int]): The map's ``(h, w)``.
        img_shape (Sequence[int]): ``(H, W)`` of the resized image, before padding (the data
            sample's ``img_shape``).
        pad_shape (Sequence[int], optional): ``(H, W)`` of the padded input the map was computed
            on (the data sample's ``pad_shape``). Default: None (no padding: ``img_shape``).
        stride (float | tuple[float, float], optional): The map's stride in pixels of the
            input, one or ``(stride_h, stride_w)``. Default: None (``pad_H / h``, ``pad_W / w``).

    Returns:
        tuple[int, int]: ``(ceil(H / stride_h), ceil(W / stride_w))``, at least 1 and at most
        ``(h, w)``.

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
    sy, sx = _strides(stride, (h, w), (pad_h, pad_w))
    # the small tolerance keeps an exact multiple exact (pad / cells in floating point)
    vh = math.ceil(img_h / sy - 1e-6)
    vw = math.ceil(img_w / sx - 1e-6)
    return min(max(vh, 1), h), min(max(vw, 1), w)


def align_to_image(maps: torch.Tensor, img_shape: Sequence[int],
                   pad_shape: Optional[Sequence[int]], ori_shape: Sequence[int],
                   stride: Optional[Stride] = None, mode: str = 'bilinear') -> torch.Tensor:
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
        stride (float | tuple[float, float], optional): As ``valid_grid`` takes it. Default:
            None (``pad_H / h``, ``pad_W / w``).
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
    vh, vw = valid_grid((h, w), (img_h, img_w), (pad_h, pad_w), stride)
    sy, sx = _strides(stride, (h, w), (pad_h, pad_w))
    x = x[:, :vh, :vw]
    # the valid cells' extent in pixels of the resized image
    cover_h = max(round(vh * sy), img_h)
    cover_w = max(round(vw * sx), img_w)
    kw = dict(align_corners=False) if mode in ('bilinear', 'bicubic') else {}
    x = F.interpolate(x[None], size=(cover_h, cover_w), mode=mode, **kw)[0]
    x = x[:, :img_h, :img_w]
    if (img_h, img_w) != (ori_h, ori_w):
        x = F.interpolate(x[None], size=(ori_h, ori_w), mode=mode, **kw)[0]
    return x[0] if squeeze else x
