"""Feature maps of a detector's or segmentor's backbone and neck, laid over the image.

What mmyolo's ``demo/featmap_vis_demo.py`` does for mmyolo's detectors, for this repo's mmdet and
mmseg configs, with each level aligned to the image (``align.align_to_image``): an image goes
through the config's test pipeline and data preprocessor as the inferencers run it, the model's
``extract_feat`` (backbone, then neck) runs once with forward hooks on the layers asked for, each
map is cropped to the cells that see the image (not the padding the preprocessor or the backbone
added) and resized to the original image, and mmengine's ``Visualizer.draw_featmap`` draws it over
the image; the drawing goes to the config's visualization backends (local files, TensorBoard,
W&B, ...) and, with ``save_arrays``, each level's maps to an ``.npz`` beside the PNG.

A level's stride is the backbone's own (``out_strides`` of deepvit_mm's backbones) scaled by the
level's grid against the backbone's first level, per axis; a backbone without ``out_strides``
(mmdet's ResNet) gives its first level's from the padded input's size.
"""
import dataclasses
import math
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .align import align_to_image, valid_grid
from .drawing import (
    VisualizationError,
    check_alpha,
    draw_label,
    drawing_visualizer,
    list_images,
    network_input,
    read_image,
    write_pictures,
)

__all__ = ['FeatmapExtractor', 'visualize_featmaps']

# --channel-reduction of mmyolo's featmap_vis_demo.py ('none': the top-k channels, each drawn)
CHANNEL_REDUCTIONS = ('squeeze_mean', 'select_max', 'none')


@dataclasses.dataclass
class FeatmapLevel:
    """One level of a layer's output, aligned to the original image.

    Attributes:
        stride (tuple[float, float]): ``(stride_h, stride_w)`` in pixels of the network input.
        grid (tuple[int, int]): The level's ``(h, w)`` cells.
        valid (tuple[int, int]): The cells that see the image (``align.valid_grid``).
        maps (torch.Tensor): ``(k, H, W)`` float32 at the original image's size: the channel mean
            (``squeeze_mean``, k = 1), the channel of the largest sum over the valid cells
            (``select_max``, k = 1) or the top-k channels by that sum (``none``).
        channels (tuple[int] | None): The channels of ``maps`` (None for the mean).
    """
    stride: Tuple[float, float]
    grid: Tuple[int, int]
    valid: Tuple[int, int]
    maps: torch.Tensor
    channels: Optional[Tuple[int, ...]]

    @property
    def label(self) -> str:
        """``'stride 8'``, or ``'stride 16x8'`` where the axes differ."""
        sy, sx = (f'{s:g}' for s in self.stride)
        return f'stride {sy}' if sy == sx else f'stride {sy}x{sx}'


@dataclasses.dataclass
class LayerFeatmaps:
    """The levels of one layer (``'backbone'``, ``'neck'``, ``'backbone.adapter'``...)."""
    layer: str
    levels: List[FeatmapLevel]


def _level_stride(extent: Tuple[float, float], grid: Tuple[int, int]) -> Tuple[float, float]:
    """A level's ``(stride_h, stride_w)`` from the pixels its grid spans (``extent``: the
    reference level's cells x stride) and its cells: the power of two whose exact grid
    (``extent / p``) is within a cell of the level's on both axes, the convolutions and poolings
    having rounded it up or down (the nearest to ``extent / grid`` where several are), else
    ``extent / grid`` per axis."""
    ratios = [e / g for e, g in zip(extent, grid)]
    fits = [2 ** k for k in range(0, 13)
            if all(abs(e / 2 ** k - g) < 1 for e, g in zip(extent, grid))]
    if fits:
        p = min(fits, key=lambda f: sum(abs(math.log2(r / f)) for r in ratios))
        return float(p), float(p)
    return tuple(round(r, 2) for r in ratios)


def _maps_of(output, layer: str) -> List[torch.Tensor]:
    """The ``(N, C, h, w)`` maps of a module's output: one tensor or a list/tuple of them."""
    outs = list(output) if isinstance(output, (list, tuple)) else [output]
    if not outs or not all(isinstance(o, torch.Tensor) and o.dim() == 4 for o in outs):
        shapes = [tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
                  for o in outs]
        raise VisualizationError(
            f'layer {layer!r} gives {shapes}, not (N, C, H, W) maps: choose a layer whose output '
            'is maps, e.g. backbone or neck (--preview-model lists the layers)')
    return outs


class FeatmapExtractor:
    """A config's model with its weights (``deepvit_mm.apis.build_inferencer``), and the layers
    whose outputs are drawn.

    Args:
        config (str): An mmdet or mmseg config file.
        checkpoint (str, optional): Its checkpoint: a file or an http(s) URL
            (``deepvit_mm.checkpoints``); None: the model's initial weights (tests).
        layers (Sequence[str]): Modules of the model run by its ``extract_feat``: ``'backbone'``,
            ``'neck'`` or a module inside them (``'backbone.adapter'``). Default: the backbone.
        device (str, optional): Default: ``deepvit_mm.apis.default_device()``.
        cfg_options (dict, optional): Overrides merged into the config (``--cfg-options``).

    Raises:
        VisualizationError: a layer the model does not have or does not run in ``extract_feat``.
        FileNotFoundError: no config file.
    """

    def __init__(self, config: str, checkpoint: Optional[str], layers: Sequence[str] = ('backbone',),
                 device: Optional[str] = None, cfg_options: Optional[dict] = None):
        from ..apis import build_inferencer
        if not layers:
            raise VisualizationError('no layer given: name one, e.g. --target-layers backbone')
        self.inferencer, self.task = build_inferencer(config, checkpoint, device,
                                                      cfg_options=cfg_options)
        self.model, self.cfg = self.inferencer.model, self.inferencer.cfg
        self.layers = tuple(dict.fromkeys(layers))
        modules = dict(self.model.named_modules())
        run = [n for n in ('backbone', 'neck') if getattr(self.model, n, None) is not None]
        for layer in self.layers:
            if layer not in modules or not any(layer == r or layer.startswith(r + '.')
                                               for r in run):
                why = ('the model has no such module' if layer not in modules else
                       'it is not run by the model\'s extract_feat')
                raise VisualizationError(
                    f'layer {layer!r}: {why}; choose {" or ".join(run)} or a module inside them '
                    '(--preview-model lists them)')
        self._modules = {n: modules[n] for n in (*self.layers, 'backbone')}

    def preview(self) -> str:
        """The model's modules, as ``print(model)`` shows them (``--preview-model``)."""
        return str(self.model)

    @torch.no_grad()
    def __call__(self, image: np.ndarray, channel_reduction: str = 'select_max',
                 topk: int = 4) -> List[LayerFeatmaps]:
        """Each layer's maps for one image, aligned to it.

        Args:
            image (np.ndarray): BGR, as ``read_image`` gives it.
            channel_reduction (str): One of ``CHANNEL_REDUCTIONS``.
            topk (int): ``'none'``: the channels kept (by their sums over the valid cells).

        Returns:
            list[LayerFeatmaps]: One a layer, in the order asked.
        """
        _check_reduction(channel_reduction)
        inputs, meta = network_input(self.inferencer, image)
        captured: Dict[str, object] = {}  # a module run twice: its first output
        handles = [m.register_forward_hook(lambda mod, args, out, n=n: captured.setdefault(n, out))
                   for n, m in self._modules.items()]
        try:
            self.model.extract_feat(inputs)
        finally:
            for h in handles:
                h.remove()
        pad_shape = tuple(inputs.shape[-2:])  # what the backbone was given
        img_shape = tuple(meta.get('img_shape', pad_shape))[:2]
        ori_shape = tuple(meta.get('ori_shape', image.shape[:2]))[:2]
        ref = self._reference(captured.get('backbone'), pad_shape)
        result = []
        for layer in self.layers:
            levels = []
            for m in _maps_of(captured[layer], layer):
                grid = tuple(m.shape[-2:])
                extent = (tuple(s * g for s, g in zip(*ref)) if ref else pad_shape)
                stride = _level_stride(extent, grid)
                valid = valid_grid(grid, img_shape, pad_shape, stride)
                chosen, channels = _reduce(m[0].float(), valid, channel_reduction, topk)
                maps = align_to_image(chosen, img_shape, pad_shape, ori_shape, stride)
                levels.append(FeatmapLevel(stride, grid, valid, maps.cpu(), channels))
            result.append(LayerFeatmaps(layer, levels))
        return result

    def _reference(self, backbone_out, pad_shape) -> Optional[tuple]:
        """``((stride_h, stride_w), (h, w))`` of the backbone's first level: the backbone's own
        stride where it declares ``out_strides``, else from the input's size. None where the
        backbone's output is not maps."""
        try:
            first = _maps_of(backbone_out, 'backbone')[0]
        except VisualizationError:
            return None
        grid = tuple(first.shape[-2:])
        strides = getattr(self.model.backbone, 'out_strides', None)
        if strides:
            s = float(strides[0])
            return (s, s), grid
        return _level_stride(pad_shape, grid), grid


def _reduce(level: torch.Tensor, valid: Tuple[int, int], mode: str,
            topk: int) -> Tuple[torch.Tensor, Optional[Tuple[int, ...]]]:
    """``(k, h, w)`` maps of a ``(C, h, w)`` level, as ``draw_featmap`` reduces channels, with
    each channel's sum taken over the valid cells only (the padding's activations do not pick a
    channel) and before the maps are resized (only the maps drawn are)."""
    if mode == 'squeeze_mean':  # the mean commutes with the crop and the (linear) resize
        return level.mean(0, keepdim=True), None
    sums = level[:, :valid[0], :valid[1]].sum((1, 2))
    if mode == 'select_max':
        k = 1
    elif topk > 0:
        k = min(topk, level.shape[0])
    elif level.shape[0] in (1, 3):  # draw_featmap's rule: the channels drawn as they are
        return level, tuple(range(level.shape[0]))
    else:
        raise VisualizationError(f'--channel-reduction none with --topk {topk}: a level of '
                                 f'{level.shape[0]} channels needs --topk > 0')
    idx = torch.topk(sums, k).indices
    return level[idx], tuple(int(i) for i in idx)


def _arrange(panels: List[np.ndarray], columns: int) -> np.ndarray:
    """Panels of one size in rows of ``columns``, the last row filled with white."""
    rows = [panels[i:i + columns] for i in range(0, len(panels), columns)]
    blank = np.full_like(panels[0], 255)
    rows[-1] = rows[-1] + [blank] * (len(rows[0]) - len(rows[-1]))
    return np.concatenate([np.concatenate(r, axis=1) for r in rows], axis=0)


def draw_layer(visualizer, image_rgb: np.ndarray, layer: LayerFeatmaps, channel_reduction: str,
               arrangement: Tuple[int, int] = (2, 2), alpha: float = 0.5) -> np.ndarray:
    """One picture of a layer: each level drawn over the image by ``draw_featmap`` and labelled
    with its stride (and channel), the levels in rows of two (as mmyolo arranges them); with
    ``'none'`` a level is its channels in ``arrangement`` (rows, columns)."""
    pictures = []
    for level in layer.levels:
        panels = []
        for i, m in enumerate(level.maps):
            drawn = visualizer.draw_featmap(
                m[None], image_rgb, channel_reduction=None if channel_reduction == 'none'
                else channel_reduction, topk=0, alpha=alpha)
            text = level.label if level.channels is None or channel_reduction == 'squeeze_mean' \
                else f'{level.label}, channel {level.channels[i]}'
            panels.append(draw_label(visualizer, drawn, text))
        pictures.append(_arrange(panels, arrangement[1]) if len(panels) > 1 else panels[0])
    if len({p.shape for p in pictures}) > 1:  # levels of different arrangements: pad to one size
        h, w = max(p.shape[0] for p in pictures), max(p.shape[1] for p in pictures)
        pictures = [np.pad(p, ((0, h - p.shape[0]), (0, w - p.shape[1]), (0, 0)),
                           constant_values=255) for p in pictures]
    return _arrange(pictures, 2)


def layer_arrays(layer: LayerFeatmaps) -> Dict[str, np.ndarray]:
    """A layer's maps as its ``.npz`` holds them: one float32 array a level, at the original
    image's size, named ``stride_<s>`` (``stride_<sh>x<sw>`` where the axes differ;
    ``level_<i>_...`` where two levels share a stride): ``(H, W)`` for one map, ``(k, H, W)`` for
    k channels; the channels drawn beside it as ``<name>_channels``."""
    arrays, names = {}, [lvl.label.replace(' ', '_') for lvl in layer.levels]
    for i, (lvl, name) in enumerate(zip(layer.levels, names)):
        name = f'level_{i}_{name}' if names.count(name) > 1 else name
        maps = lvl.maps.numpy().astype(np.float32)
        arrays[name] = maps[0] if maps.shape[0] == 1 else maps
        if lvl.channels is not None:
            arrays[f'{name}_channels'] = np.asarray(lvl.channels, dtype=np.int64)
    return arrays


def _check_reduction(channel_reduction: str) -> None:
    if channel_reduction not in CHANNEL_REDUCTIONS:
        raise VisualizationError(f'channel reduction {channel_reduction!r}: choose from '
                                 f'{", ".join(CHANNEL_REDUCTIONS)}')


def _check_arrangement(arrangement: Sequence[int], channel_reduction: str, topk: int) -> None:
    if len(arrangement) != 2 or min(arrangement) < 1:
        raise VisualizationError(f'arrangement {tuple(arrangement)}: give rows and columns, '
                                 'e.g. --arrangement 2 2')
    if channel_reduction == 'none' and topk > arrangement[0] * arrangement[1]:
        raise VisualizationError(f'--topk {topk} channels do not fit --arrangement '
                                 f'{arrangement[0]} {arrangement[1]}: give rows x columns >= topk')


def visualize_featmaps(inputs, config: str, checkpoint: str, out_dir: str, *,
                       layers: Sequence[str] = ('backbone',),
                       channel_reduction: str = 'select_max', topk: int = 4,
                       arrangement: Tuple[int, int] = (2, 2), alpha: float = 0.5,
                       save_arrays: bool = False, device: Optional[str] = None,
                       cfg_options: Optional[dict] = None,
                       extractor: Optional[FeatmapExtractor] = None) -> List[str]:
    """Draw the feature maps of every image of ``inputs`` (``tools/analysis/featmap_vis.py``).

    For each image and layer, ``out_dir/<image stem>_<layer>_0.png`` (and the config's other
    backends) and, with ``save_arrays``, its ``.npz`` (``layer_arrays``). Nothing is written
    before the images are read, the layers found, the flags checked, the first maps computed.

    Args:
        inputs (str | Sequence[str]): Image files or folders of them.
        config, checkpoint, layers, device, cfg_options: As ``FeatmapExtractor`` takes them.
        out_dir (str): Where the pictures go.
        channel_reduction, topk: As ``FeatmapExtractor.__call__`` takes them.
        arrangement (tuple[int, int]): ``'none'``: rows and columns of a level's channels.
        alpha (float): The maps' weight over the image, in [0, 1].
        save_arrays (bool): Also write the ``.npz`` of each picture.
        extractor (FeatmapExtractor, optional): One already built (config, checkpoint, layers,
            device and cfg_options are then its own).

    Returns:
        list[str]: The files written under ``out_dir`` (each PNG, then its ``.npz``).

    Raises:
        VisualizationError: an unreadable image, a layer the model has not, flags that do not
            fit; nothing is written then.
    """
    _check_reduction(channel_reduction)
    _check_arrangement(arrangement, channel_reduction, topk)
    check_alpha(alpha)
    files = list_images(inputs)
    extractor = extractor or FeatmapExtractor(config, checkpoint, layers, device, cfg_options)
    vis = drawing_visualizer()

    def pictures(path):
        image = read_image(path)
        rgb, stem = np.ascontiguousarray(image[..., ::-1]), osp.splitext(osp.basename(path))[0]
        return [(f'{stem}_{layer.layer}', draw_layer(vis, rgb, layer, channel_reduction,
                                                     tuple(arrangement), alpha),
                 lambda layer=layer: layer_arrays(layer))
                for layer in extractor(image, channel_reduction, topk)]
    backends = (extractor.cfg.get('visualizer') or {}).get('vis_backends')
    return write_pictures(files, pictures, out_dir, backends, save_arrays)
