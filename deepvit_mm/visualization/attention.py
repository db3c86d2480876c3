"""Attention maps of every family, as timm's own attention modules compute them.

What each family has to draw (Ali et al., XCiT, NeurIPS 2021, Fig. 4; Touvron et al., CaiT,
ICCV 2021, Fig. 6; Caron et al., DINO, ICCV 2021, Fig. 1 and its ``visualize_attention.py``):

* **Class attention** (XCiT's and CaiT's classifiers: 2 layers, the class token over the patches).
  The dense backbones drop these layers (the official XCiT detectors drop ``cls_token`` and
  ``cls_attn_blocks``): their maps come from the classification weights.
* **Self-attention** (ViT, DeiT III, DINOv2, EVA-02, BEiT, and CaiT's trunk, in a classifier or
  inside a detector or segmentor): the CLS token's row, or a chosen patch's row, over the patches.
  A block that attends within ViTDet's windows has no map over the image.
* **XCiT's XCA blocks** attend over channels (cross-covariance, ``C/h x C/h`` per head): no map
  over the image; their feature maps are ``tools/analysis/featmap_vis.py``'s.

The weights are taken as ``timm.utils.AttentionExtract`` takes them: each chosen module's fused
attention is switched off for the forward (and our CaiT backbones' query chunks), and a forward
hook on its ``attn_drop`` keeps what that receives, the weights applied to the values, with all
the family adds as timm adds it (BEiT's relative position bias, EVA-02's rotary embedding, CaiT's
talking heads); the forward stops once the last chosen module has its weights. Written here is
only what timm has not: the query's row over the patch grid (class attention's one query, the
CLS token's, a patch's), DINO's top share of attention mass, and the map laid over the original
image (``.align.align_to_image``: cropped to the cells that see the image, then resized).
"""
import contextlib
import os.path as osp
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models import beit, cait, eva, vision_transformer, xcit

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

__all__ = ['AttentionDrawer', 'attention_sites', 'attention_probs', 'attention_maps',
           'visualize_attention']

#: what ``attention_maps`` draws: ``class`` (class-attention layers), ``cls`` (the CLS token's
#: row of a self-attention block), ``patch`` (a patch's row of a self-attention block)
ATTENTION_KINDS = ('class', 'cls', 'patch')
FEATMAP_TOOL = 'tools/analysis/featmap_vis.py'
_SELF_ATTENTION = (vision_transformer.Attention, eva.EvaAttention, beit.Attention,
                   cait.TalkingHeadAttn)


class AttentionError(VisualizationError):
    """A request the model cannot answer (a block it does not have, an attention it does not
    compute); its message is one line saying what to do instead."""


def _channel_attention() -> AttentionError:
    return AttentionError(
        "XCiT's XCA blocks attend over channels (cross-covariance, C/h x C/h per head), not over "
        f'the image: draw their feature maps with {FEATMAP_TOOL}.')


def _windowed(what: str, window_size: int) -> AttentionError:
    return AttentionError(f'{what} attends within {window_size}x{window_size} windows, not over '
                          'the image: choose a global block.')


# --------------------------------------------------------------------------------------------
# the attention modules of a model, and timm's weights of them
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a model.

    Attributes:
        name (str): Its path in the model (``blocks.3.attn``, ``backbone.trunk.blocks.3.attn``).
        module (nn.Module): The module.
        kind (str): ``'self'`` (tokens over tokens), ``'class'`` (the class token over the
            tokens) or ``'channel'`` (XCiT's cross-covariance attention).
        index (int): The block's index among the self/channel-attention blocks, or the layer's
            among the class-attention layers.
        window_size (int): 0 for global attention, else the side of ViTDet's windows.
    """
    name: str
    module: nn.Module = field(repr=False, compare=False)
    kind: str
    index: int
    window_size: int = 0


def attention_sites(model: nn.Module) -> List[AttentionSite]:
    """Every attention module of ``model`` that this module knows, in the order they run.

    Args:
        model (nn.Module): A timm classifier, a deepvit_mm backbone, or a detector or segmentor
            holding one.

    Returns:
        list[AttentionSite]: Self- and channel-attention blocks (numbered together, as the
        trunk's blocks), then class-attention layers (numbered on their own).
    """
    from ..models.backbones.windows import GridAttention
    blocks, layers = [], []
    for name, m in model.named_modules():
        if isinstance(m, cait.ClassAttn):
            layers.append(AttentionSite(name, m, 'class', len(layers)))
        elif isinstance(m, xcit.XCA):
            blocks.append(AttentionSite(name, m, 'channel', len(blocks)))
        elif isinstance(m, _SELF_ATTENTION):
            # BEiT's `window_size` is its relative position grid, not a window: only the grid
            # attention of our backbones has windows
            ws = int(getattr(m, 'window_size', 0) or 0) if isinstance(m, GridAttention) else 0
            blocks.append(AttentionSite(name, m, 'self', len(blocks), ws))
    return blocks + layers


@contextlib.contextmanager
def _timm_weights(modules: Dict[str, nn.Module], keep: Callable[[str, torch.Tensor], None]):
    """Inside the block, each forward of a module of ``modules`` calls ``keep(name, weights)``
    with the weights timm's attention applies to its values (``AttentionExtract``'s hook on
    ``attn_drop``), fused attention and query chunks off; both restored after."""
    saved = [(m, k, getattr(m, k)) for m in modules.values() for k in ('fused_attn', 'query_chunk')
             if hasattr(m, k)]
    for m, k, _ in saved:
        setattr(m, k, False if k == 'fused_attn' else None)
    hooks = [m.attn_drop.register_forward_hook(lambda mod, args, out, n=n: keep(n, out.detach()))
             for n, m in modules.items()]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        for m, k, v in saved:
            setattr(m, k, v)


def attention_probs(attn: nn.Module, x: torch.Tensor, queries: Optional[Sequence[int]] = None,
                    **kwargs) -> torch.Tensor:
    """The attention weights ``attn`` applies to its values, from one forward of it as timm
    computes them (fused attention off).

    Args:
        attn (nn.Module): An attention module of ``attention_sites`` but XCiT's XCA: timm's ViT
            (DeiT III, DINOv2), EVA-02, BEiT, talking-heads (CaiT) and class attention (XCiT,
            CaiT), and our backbones' grid versions.
        x (Tensor): What the module receives: ``(B, N, C)`` tokens, or our backbones' ``(B, H, W,
            C)`` grid.
        queries (Sequence[int], optional): The query rows kept. Default: every row (class
            attention: its one row).
        kwargs: What the block passes besides ``x``: ``rope`` (EVA-02), ``shared_rel_pos_bias``
            (BEiT), ``attn_mask``.

    Returns:
        Tensor: ``(B, heads, len(queries), N)`` float32; rows sum to 1 except CaiT's
        self-attention (talking heads mix the heads again after the softmax).

    Raises:
        AttentionError: XCiT's XCA (channel attention), or a block attending within windows.
    """
    if isinstance(attn, xcit.XCA):
        raise _channel_attention()
    got = []
    with torch.no_grad(), _timm_weights({'': attn}, lambda name, w: got.append(w)):
        attn(x, **kwargs)
    if got[0].shape[0] != x.shape[0]:  # a batch of windows
        raise _windowed('this block', getattr(attn, 'window_size', 0))
    return (got[0] if queries is None else got[0][:, :, list(queries)]).float()


# --------------------------------------------------------------------------------------------
# maps over the patch grid
# --------------------------------------------------------------------------------------------
@dataclass
class AttentionMap:
    """One attention module's maps for one query, over the input's patch grid.

    Attributes:
        site (AttentionSite): The module.
        label (str): What it is (``class-attention layer 0``, ``block 11, CLS token``).
        tag (str): The same for file names (``class_attn0``, ``block11_cls``).
        heads (Tensor): ``(heads, gh, gw)`` float32 over the input's patch grid, its padding
            included.
        patch_size (tuple[int, int]): Pixels a cell covers, ``(height, width)``.
    """
    site: AttentionSite
    label: str
    tag: str
    heads: torch.Tensor
    patch_size: Tuple[int, int]

    @property
    def grid(self) -> Tuple[int, int]:
        return tuple(self.heads.shape[-2:])

    @property
    def pad_shape(self) -> Tuple[int, int]:
        """The input pixels the grid covers, padding included."""
        return self.grid[0] * self.patch_size[0], self.grid[1] * self.patch_size[1]

    def maps(self) -> Dict[str, torch.Tensor]:
        """``{'head0': ..., 'head1': ..., 'mean': ...}``, each ``(gh, gw)``."""
        out = {f'head{i}': m for i, m in enumerate(self.heads)}
        out['mean'] = self.heads.mean(0)
        return out

    def aligned(self, img_shape: Sequence[int], ori_shape: Sequence[int],
                mode: str = 'bilinear') -> Dict[str, np.ndarray]:
        """``maps()`` at the original image's size (``align_to_image``), from the image's
        ``img_shape`` in input pixels before padding; ``mode``: ``F.interpolate``'s."""
        maps = self.maps()
        stack = align_to_image(torch.stack(list(maps.values())), img_shape, self.pad_shape,
                               ori_shape, mode=mode)
        return {k: v.numpy() for k, v in zip(maps, stack)}


def top_mass_mask(maps: torch.Tensor, share: float,
                  valid: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """DINO's threshold (``visualize_attention.py --threshold``): per map, the cells holding the
    top ``share`` of its attention mass, counted over its ``valid`` cells (the padding's are never
    kept).

    Args:
        maps (Tensor): ``(..., h, w)``, non-negative.
        share (float): In (0, 1], e.g. 0.6.
        valid (tuple[int, int], optional): The cells ``[:vh, :vw]`` that see the image. Default:
            every cell.

    Returns:
        Tensor: bool, the shape of ``maps``.

    Raises:
        AttentionError: ``share`` outside (0, 1], or a map with negative values.
    """
    _check_threshold(share)
    if (maps < 0).any():
        raise AttentionError('--threshold keeps a share of attention mass, and these maps have '
                             'negative weights (CaiT\'s talking heads mix the heads after the '
                             'softmax): draw them without --threshold.')
    h, w = maps.shape[-2:]
    vh, vw = valid or (h, w)
    inside = torch.zeros(h, w, dtype=torch.bool)
    inside[:vh, :vw] = True
    flat = torch.where(inside, maps, torch.zeros(())).flatten(-2)
    total = flat.sum(-1, keepdim=True).clamp_min(torch.finfo(flat.dtype).tiny)
    values, order = torch.sort(flat / total, dim=-1)  # ascending, as DINO's
    keep_sorted = values.cumsum(-1) > (1 - share)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return keep.reshape(maps.shape) & inside


def _check_threshold(share: Optional[float]) -> None:
    if share is not None and not 0 < share <= 1:
        raise AttentionError(f'--threshold {share}: give the share of attention mass to keep, '
                             'in (0, 1], e.g. 0.6.')


class _Captured(Exception):
    """Raised by the last hook once every chosen module has its weights: the rest of the forward
    is not needed."""


def _grid_of(patch_embed: nn.Module, inputs: tuple, output: Any) -> Tuple[int, int]:
    """The token grid a patch embedding made from its input."""
    if isinstance(output, tuple):  # XCiT's ConvPatchEmbed: (tokens, (Hp, Wp))
        return int(output[1][0]), int(output[1][1])
    if output.dim() == 4:  # NHWC (timm's dynamic_img_size)
        return int(output.shape[1]), int(output.shape[2])
    size = inputs[0].shape[-2:]
    if hasattr(patch_embed, 'dynamic_feat_size'):
        return tuple(int(s) for s in patch_embed.dynamic_feat_size(tuple(size)))
    p = _pair(patch_embed.patch_size)
    return -(-size[0] // p[0]), -(-size[1] // p[1])


def _pair(v) -> Tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _patch_embed(model: nn.Module) -> nn.Module:
    for name, m in model.named_modules():
        if name.split('.')[-1] == 'patch_embed':
            return m
    raise AttentionError(f'{type(model).__name__} has no patch embedding (patch_embed): not a '
                         'vision transformer this tool knows.')


def _query_map(site: AttentionSite, weights: torch.Tensor, query: str,
               cell: Optional[Tuple[int, int]], grid: dict) -> AttentionMap:
    """The query's row of a site's weights ``(B, heads, n, N)``, over the patch grid ``grid``
    (``hw``, ``batch``, ``patch``: what the patch embedding made)."""
    if weights.shape[0] != grid['batch']:  # a batch of windows
        raise _windowed(f'block {site.index}', site.window_size)
    (gh, gw), n_tokens = grid['hw'], weights.shape[-1]
    prefix = n_tokens - gh * gw  # class, register, distillation tokens before the patches
    if prefix < 0:
        raise AttentionError(f'{site.name} attends over {n_tokens} tokens, fewer than the '
                             f'{gh}x{gw} patches.')
    if site.kind == 'class':  # the class token, the only query
        row, label, tag = 0, f'class-attention layer {site.index}', f'class_attn{site.index}'
    elif query == 'cls':
        if prefix == 0:
            raise AttentionError(f'block {site.index} has no class token (a dense trunk with '
                                 'windows drops it, CaiT\'s trunk has none): use --attention '
                                 'patch.')
        row, label, tag = 0, f'block {site.index}, CLS token', f'block{site.index}_cls'
    else:
        r, c = cell
        row, label, tag = (prefix + r * gw + c, f'block {site.index}, patch (row {r}, col {c})',
                           f'block{site.index}_patch_r{r}c{c}')
    heads = weights[0, :, row, prefix:].float().reshape(-1, gh, gw).cpu()
    return AttentionMap(site, label, tag, heads, grid['patch'])


def attention_maps(model: nn.Module, run: Callable[[], Any], sites: Sequence[AttentionSite],
                   query: str, cell: Optional[Tuple[int, int]] = None) -> List[AttentionMap]:
    """Run ``run()`` (a forward of ``model``) and return the maps of ``sites`` for ``query``.

    Args:
        model (nn.Module): The model ``run`` runs; its ``patch_embed`` gives the grid.
        run (callable): Calls the model's forward on one image.
        sites (Sequence[AttentionSite]): Modules of ``model`` (``attention_sites``).
        query (str): ``'class'`` (class-attention sites), ``'cls'`` (the CLS token's row) or
            ``'patch'`` (the row of the patch at ``cell``).
        cell (tuple[int, int], optional): ``(row, col)`` on the patch grid, for ``'patch'``.

    Returns:
        list[AttentionMap]: One per site, in ``sites``' order.

    Raises:
        AttentionError: XCiT's XCA or a windowed block among ``sites``, a query a site cannot
            answer, a forward that does not reach them.
    """
    if query not in ATTENTION_KINDS:
        raise AttentionError(f'attention {query!r}: choose one of {", ".join(ATTENTION_KINDS)}.')
    if any(s.kind == 'channel' for s in sites):
        raise _channel_attention()
    embed, by_name = _patch_embed(model), {s.name: s for s in sites}
    grid: Dict[str, Any] = {}
    maps: Dict[str, AttentionMap] = {}

    def keep_grid(module, args, output):
        grid.update(hw=_grid_of(module, args, output), batch=args[0].shape[0],
                    patch=_pair(module.patch_size))

    def keep(name, weights):
        if 'hw' in grid and name not in maps:
            maps[name] = _query_map(by_name[name], weights, query, cell, grid)
        if len(maps) == len(by_name):
            raise _Captured

    handle = embed.register_forward_hook(keep_grid)
    try:
        with torch.no_grad(), _timm_weights({s.name: s.module for s in sites}, keep):
            run()
    except _Captured:
        pass
    finally:
        handle.remove()
    missing = [n for n in by_name if n not in maps]
    if missing:
        raise AttentionError(f'the forward did not reach {", ".join(missing)} after the patch '
                             'embedding.')
    return [maps[s.name] for s in sites]


# --------------------------------------------------------------------------------------------
# classifiers: timm's, with weights from a file
# --------------------------------------------------------------------------------------------
# timm modules whose models take any input size when built with dynamic_img_size
_DYNAMIC = ('vision_transformer', 'deit', 'eva')


def build_classifier(name: str, checkpoint: Optional[str] = None,
                     **kwargs) -> Tuple[nn.Module, str]:
    """A timm classifier with its classification weights: ``timm.create_model`` with the
    checkpoint as its pretrained weights (timm's ``checkpoint_filter_fn`` converts the official
    XCiT/CaiT/DeiT layouts and resolutions; the load is strict).

    Args:
        name (str): timm's model name (``xcit_small_12_p8_224``; a pretrained tag such as
            ``.fb_in1k`` picks those weights on the hub).
        checkpoint (str, optional): Its weights: a path, URL or ``hf-hub:`` name, read by
            ``deepvit_mm.checkpoints.read_checkpoint`` (no code run from a pickle). Default:
            timm's pretrained weights of ``name`` on the Hugging Face hub.
        kwargs: More arguments of the timm model (tests build small ones: ``depth=2``).

    Returns:
        tuple[nn.Module, str]: The model in eval mode, and where its weights came from.

    Raises:
        AttentionError: an unknown name, no weights for it, or weights that do not fit it.
    """
    import timm

    from ..checkpoints import CheckpointError, extract_state_dict, read_checkpoint
    base = name.split('.')[0]
    if not timm.is_model(base):
        import difflib
        close = difflib.get_close_matches(base, timm.list_models(), n=1)
        raise AttentionError(f'{name!r} is neither a config file (.py) nor a timm model name'
                             + (f'; did you mean {close[0]!r}?' if close else '.'))
    if timm.models.is_model_in_modules(base, _DYNAMIC):
        kwargs.setdefault('dynamic_img_size', True)  # any input size
    if checkpoint is None:
        hub = timm.models.get_pretrained_cfg(name).hf_hub_id
        if not hub:
            raise AttentionError(f'timm has no hub weights for {name!r}: give its checkpoint.')
        checkpoint = 'hf-hub:' + hub
    try:
        sd = extract_state_dict(read_checkpoint(checkpoint))
        model = timm.create_model(name, pretrained=True,
                                  pretrained_cfg_overlay=dict(state_dict=sd), **kwargs)
    except (CheckpointError, OSError, KeyError) as e:
        raise AttentionError(f'{checkpoint}: {_first_line(e)}') from None
    except (RuntimeError, ValueError) as e:  # timm's strict load: torch names the keys
        raise AttentionError(_misfit(checkpoint, base, e)) from None
    return model.eval(), str(checkpoint)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _misfit(checkpoint: str, base: str, e: BaseException) -> str:
    """One line for a checkpoint whose strict load failed, from torch's message."""
    lines = [x.strip() for x in str(e).splitlines()]
    missing, unexpected = (re.findall(r'"([^"]+)"', next((x for x in lines if x.startswith(w)), ''))
                           for w in ('Missing key', 'Unexpected key'))
    if not (missing or unexpected):  # e.g. a size mismatch: torch's first
        return f'{checkpoint} does not fit {base}: {next((x for x in lines[1:] if x), lines[0])}'
    return (f'{checkpoint} does not fit {base}: {len(missing)} of the model\'s tensors are not in '
            f'it ({", ".join(missing[:3])}{", ..." if len(missing) > 3 else ""}), '
            f'{len(unexpected)} of its tensors are not in the model; give the timm name it was '
            'trained as.')


def classifier_input(model: nn.Module, image: np.ndarray,
                     input_size: Optional[int] = None) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """An RGB image as a timm classifier takes it: resized to fit ``input_size`` (its aspect
    kept), normalized with the model's mean and std, zero-padded at the bottom/right to a
    multiple of the patch (the model's own input size where its grid is fixed: CaiT, BEiT).

    Args:
        model (nn.Module): A timm classifier.
        image (np.ndarray): ``(H, W, 3)`` uint8 RGB.
        input_size (int, optional): The longer side after resizing. Default: the model's
            pretrained input size (224 for ``*_224``).

    Returns:
        tuple[Tensor, tuple[int, int]]: ``(1, 3, H', W')`` input, and ``img_shape``: the resized
        image's ``(H, W)`` before padding.
    """
    from timm.data import resolve_data_config
    cfg = resolve_data_config({}, model=model)
    embed = _patch_embed(model)
    h, w = image.shape[:2]
    fixed = None
    if getattr(model, 'dynamic_img_size', False) or isinstance(model, xcit.Xcit):
        scale = int(input_size or cfg['input_size'][-1]) / max(h, w)
    else:  # one grid (CaiT, BEiT): the image fits in it
        fixed = _pair(embed.img_size)
        if input_size is not None and input_size > min(fixed):
            raise AttentionError(f'--input-size {input_size}: {type(model).__name__} runs at one '
                                 f'grid ({fixed[0]}x{fixed[1]} pixels); give at most '
                                 f'{min(fixed)}.')
        scale = min(fixed[0] / h, fixed[1] / w, (input_size or max(fixed)) / max(h, w))
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    if fixed:  # rounding must not push a side past the grid
        nh, nw = min(nh, fixed[0]), min(nw, fixed[1])
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float() / 255
    x = F.interpolate(x, size=(nh, nw), mode='bicubic', align_corners=False, antialias=True)
    x = (x.clamp(0, 1) - torch.tensor(cfg['mean']).view(1, 3, 1, 1)) / \
        torch.tensor(cfg['std']).view(1, 3, 1, 1)
    p = _pair(embed.patch_size)
    ph, pw = fixed or (-(-nh // p[0]) * p[0], -(-nw // p[1]) * p[1])
    return F.pad(x, (0, pw - nw, 0, ph - nh)), (nh, nw)


# --------------------------------------------------------------------------------------------
# the tool's work: a model, images, the maps drawn and written
# --------------------------------------------------------------------------------------------
@dataclass
class AttentionPicture:
    """A map drawn over the image, and its numbers.

    Attributes:
        name (str): The picture's name (``cat_class_attn0_head1``); the files are
            ``<name>_0.png`` and ``<name>_0.npz`` (mmengine's local backend adds the step).
        image (np.ndarray): The drawing, ``(H, W, 3)`` uint8 RGB.
        array (np.ndarray): The map at the original image's size, float32.
        mask (np.ndarray, optional): ``threshold``'s kept pixels, bool.
    """
    name: str
    image: np.ndarray
    array: np.ndarray
    mask: Optional[np.ndarray] = None

    def arrays(self) -> Dict[str, np.ndarray]:
        """What its ``.npz`` holds: ``map`` (float32) and, for a threshold, ``mask``."""
        out = dict(map=self.array.astype(np.float32))
        if self.mask is not None:
            out['mask'] = self.mask
        return out


@dataclass
class ImageAttention:
    """An image's maps (``AttentionDrawer.compute``).

    Attributes:
        path (str): The image file.
        image (np.ndarray): The image, ``(H, W, 3)`` uint8 RGB.
        maps (list[AttentionMap]): Over the network input's patch grid.
        img_shape (tuple[int, int]): The image in the network input, before padding.
        ori_shape (tuple[int, int]): The image's own ``(H, W)``.
        xy (tuple[float, float], optional): The query patch's pixel (``'patch'``).
    """
    path: str
    image: np.ndarray
    maps: List[AttentionMap]
    img_shape: Tuple[int, int]
    ori_shape: Tuple[int, int]
    xy: Optional[Tuple[float, float]] = None


def _parse_patch(patch: Optional[str], ori_shape: Tuple[int, int]) -> Tuple[float, float]:
    """``'x,y'`` in image pixels (default: the image's centre)."""
    h, w = ori_shape
    if patch is None:
        return (w - 1) / 2, (h - 1) / 2
    m = re.fullmatch(r'\s*(\d+(?:\.\d*)?)\s*,\s*(\d+(?:\.\d*)?)\s*', str(patch))
    if not m:
        raise AttentionError(f'--patch {patch!r}: give x,y in image pixels, e.g. --patch '
                             f'{w // 2},{h // 2}.')
    x, y = float(m.group(1)), float(m.group(2))
    if not (x < w and y < h):
        raise AttentionError(f'--patch {patch}: outside the {w}x{h} image (give x < {w}, '
                             f'y < {h}).')
    return x, y


def _pick(sites: List[AttentionSite], i: int, model_name: str, what: str) -> AttentionSite:
    if not -len(sites) <= i < len(sites):
        raise AttentionError(f'{model_name} has no {what} {i}: its {what}s are 0-{len(sites) - 1}.')
    return sites[i]


def _choose(sites: List[AttentionSite], kind: str, blocks: Optional[Sequence[int]],
            model_name: str) -> List[AttentionSite]:
    """The sites of the request, or an AttentionError saying what the model has instead."""
    if kind == 'class':
        layers = [s for s in sites if s.kind == 'class']
        return layers if blocks is None else \
            [_pick(layers, i, model_name, 'class-attention layer') for i in blocks]
    trunk = [s for s in sites if s.kind != 'class']
    if not trunk:
        raise AttentionError(f'{model_name} has no self-attention blocks.')
    if all(s.kind == 'channel' for s in trunk):
        raise AttentionError(
            f"{model_name}: XCiT's blocks attend over channels (cross-covariance), not over the "
            f'image: draw its feature maps with {FEATMAP_TOOL}, or its class attention '
            '(--attention class, from the classification weights).')
    global_ = [s.index for s in trunk if not s.window_size]
    chosen = [_pick(trunk, i, model_name, 'block') for i in
              ([global_[-1]] if blocks is None else blocks)]
    for site in chosen:
        if site.window_size:
            raise AttentionError(
                f'{model_name}: block {site.index} attends within {site.window_size}x'
                f'{site.window_size} windows, not over the image; its global blocks are '
                f'{", ".join(map(str, global_))}.')
    return chosen


def _is_path(s: str) -> bool:
    return osp.exists(s) or s.startswith(('http://', 'https://', 'hf-hub:')) or \
        s.endswith(('.pth', '.pt', '.bin', '.safetensors'))


class AttentionDrawer:
    """A model and the attention asked of it, checked before any image is read.

    Args:
        model (str): A detector's or segmentor's config file (``.py``), or a timm classifier's
            name (``xcit_small_12_p8_224``, ``vit_small_patch14_dinov2.lvd142m``).
        checkpoint (str, optional): The config's trained weights (required with a config; a
            checkpoint leaving any of the model at init is refused), or the classifier's
            (``build_classifier``).
        attention (str): ``'class'``, ``'cls'``, ``'patch'``, or ``'auto'``: class attention
            for a classifier that has it (XCiT, CaiT), else the CLS token's; a patch's for a
            config. Default: ``'auto'``.
        blocks (Sequence[int], optional): The blocks (``cls``, ``patch``; default: the last
            global one) or class-attention layers (``class``; default: all), 0-based.
        classifier (str, optional): With a config whose backbone has no class-attention layers
            (every dense backbone): the classifier whose class attention to draw, a timm name or
            a checkpoint of the backbone's timm arch.
        input_size (int, optional): A classifier's input: the image's longer side
            (``classifier_input``).
        cfg_options (dict, optional): Overrides of the config.
        device (str, optional): Default: ``deepvit_mm.apis.default_device()``.
        log (callable): Where the one-line notes go. Default: ``print``.

    Raises:
        AttentionError: the model cannot answer the request (the message says what it has).
    """

    def __init__(self, model: str, checkpoint: Optional[str] = None, *,
                 attention: str = 'auto', blocks: Optional[Sequence[int]] = None,
                 classifier: Optional[str] = None, input_size: Optional[int] = None,
                 cfg_options: Optional[dict] = None, device: Optional[str] = None,
                 log: Callable[[str], None] = print) -> None:
        from ..apis import build_inferencer, default_device
        from ..checkpoints import require_complete_model
        if attention not in ('auto',) + ATTENTION_KINDS:
            raise AttentionError(f'--attention {attention!r}: choose auto or one of '
                                 f'{", ".join(ATTENTION_KINDS)}.')
        self.device, self.input_size, self.inferencer = default_device(device), input_size, None
        if model.endswith('.py'):
            if checkpoint is None:
                raise AttentionError(f'{model} is a config: give its trained checkpoint too.')
            with require_complete_model():  # a backbone-only one would be drawn as the model's
                self.inferencer, _ = build_inferencer(model, checkpoint, self.device,
                                                      cfg_options=cfg_options)
            self.model, self.name = self.inferencer.model, osp.splitext(osp.basename(model))[0]
            kind = 'patch' if attention == 'auto' else attention
        else:
            self._load_classifier(model, checkpoint, model)
            has_class = any(s.kind == 'class' for s in attention_sites(self.model))
            kind = attention if attention != 'auto' else ('class' if has_class else 'cls')
        if kind == 'class' and not any(s.kind == 'class' for s in attention_sites(self.model)):
            self._class_attention_elsewhere(model, classifier, log)
        self.kind = kind
        self.sites = _choose(attention_sites(self.model), kind, blocks, self.name)
        self.vis = drawing_visualizer()

    def _load_classifier(self, name: str, checkpoint: Optional[str], label: str) -> None:
        self.model, self.name = build_classifier(name, checkpoint)[0].to(self.device), label

    def _class_attention_elsewhere(self, model: str, classifier: Optional[str], log) -> None:
        """A model without class-attention layers: the classifier named takes its place."""
        if self.inferencer is None:
            raise AttentionError(f'{model} has no class-attention layers (XCiT and CaiT '
                                 'classifiers have them): use --attention cls or patch.')
        backbone = getattr(self.model, 'backbone', self.model)
        arch = getattr(getattr(getattr(backbone, 'args', None), 'spec', None), 'timm', None)
        what = f'{type(backbone).__name__}' + (f' ({arch})' if arch else '')
        if classifier is None:
            raise AttentionError(
                f'{self.name}: its {what} backbone has no class-attention blocks (dense backbones '
                "drop them, as the official XCiT detectors do): give --classifier NAME_OR_PATH, "
                f'a timm name or a classification checkpoint of {arch or "the backbone"}, to draw '
                "the pretrained classifier's.")
        name, ckpt = (arch, classifier) if _is_path(classifier) else (classifier, None)
        if name is None:
            raise AttentionError(f'--classifier {classifier}: the backbone has no timm name to '
                                 'build it as; give a timm name.')
        log(f'{self.name}: its {what} backbone has no class-attention blocks (dense backbones '
            f"drop them); drawing the pretrained classifier {name}'s.")
        self._load_classifier(name, ckpt, f'pretrained classifier {name}')

    def _prepare(self, image: np.ndarray):
        """The forward on one image (BGR), and the image's ``img_shape`` in input pixels."""
        if self.inferencer is None or self.model is not self.inferencer.model:  # a classifier
            x, img_shape = classifier_input(self.model, image[..., ::-1], self.input_size)
            x = x.to(self.device)
            return (lambda: self.model(x)), img_shape
        inputs, meta = network_input(self.inferencer, image)
        return (lambda: self.model.backbone(inputs)), tuple(meta['img_shape'][:2])

    def compute(self, path: str, patch: Optional[str] = None) -> ImageAttention:
        """The maps of one image, before they are drawn.

        Args:
            path (str): The image file.
            patch (str, optional): ``'x,y'`` in the image's pixels, for ``'patch'``. Default: the
                image's centre.
        """
        image = read_image(path)
        ori_shape = tuple(image.shape[:2])
        run, img_shape = self._prepare(image)
        cell = xy = None
        if self.kind == 'patch':
            xy = _parse_patch(patch, ori_shape)
            p = _pair(_patch_embed(self.model).patch_size)
            # the pixel in the network input: the image scaled to img_shape, padded after it
            cell = (int(xy[1] * img_shape[0] / ori_shape[0] // p[0]),
                    int(xy[0] * img_shape[1] / ori_shape[1] // p[1]))
        maps = attention_maps(self.model, run, self.sites, self.kind, cell)
        return ImageAttention(path, np.ascontiguousarray(image[..., ::-1]), maps,
                              tuple(int(s) for s in img_shape), ori_shape, xy)

    def __call__(self, path: str, *, patch: Optional[str] = None,
                 threshold: Optional[float] = None, alpha: float = 0.5,
                 vis=None) -> List[AttentionPicture]:
        """The pictures of one image: per map, each head and the heads' mean (and with
        ``threshold``, each with the top share of its mass kept).

        Args:
            path (str): The image file.
            patch (str, optional): As ``compute`` takes it.
            threshold (float, optional): DINO's share of attention mass to keep (0.6).
            alpha (float): The map's weight over the image. Default: 0.5.
            vis (Visualizer, optional): Draws (mmengine's ``Visualizer``). Default: the
                drawer's own.
        """
        result = self.compute(path, patch)
        vis = vis or self.vis
        stem, xy, out = osp.splitext(osp.basename(path))[0], result.xy, []
        for m in result.maps:
            masks = _masks(m, threshold, result.img_shape, result.ori_shape)
            what = m.label if xy is None else \
                f'block {m.site.index}, patch at x,y = {xy[0]:.0f},{xy[1]:.0f}'
            for head, arr in m.aligned(result.img_shape, result.ori_shape).items():
                label = f'{self.name}\n{what}, {"mean of heads" if head == "mean" else head}'
                name = f'{stem}_{m.tag}_{head}'
                out.append(AttentionPicture(name, _draw(vis, arr, result.image, label, alpha,
                                                        xy), arr))
                if head in masks:
                    kept, pct = np.where(masks[head], arr, 0).astype(np.float32), \
                        round(threshold * 100)
                    label = f'{label}, top {pct}% of its mass'
                    out.append(AttentionPicture(f'{name}_top{pct}', _draw(
                        vis, kept, result.image, label, alpha, xy), kept, masks[head]))
        return out


def _masks(m: AttentionMap, threshold: Optional[float], img_shape,
           ori_shape) -> Dict[str, np.ndarray]:
    """``top_mass_mask`` of each of ``m.maps()`` at the original image's size."""
    if threshold is None:
        return {}
    grid_maps = m.maps()
    keep = top_mass_mask(torch.stack(list(grid_maps.values())), threshold,
                         valid_grid(m.grid, img_shape, m.pad_shape))
    aligned = align_to_image(keep.float(), img_shape, m.pad_shape, ori_shape,
                             mode='nearest-exact')
    return {k: v.numpy() > 0.5 for k, v in zip(grid_maps, aligned)}


def _draw(vis, arr: np.ndarray, image: np.ndarray, label: str, alpha: float,
          xy: Optional[Tuple[float, float]]) -> np.ndarray:
    """The map over the image (mmengine's ``draw_featmap``, one channel), labelled, the query
    patch marked."""
    drawn = vis.draw_featmap(torch.from_numpy(arr)[None], overlaid_image=image,
                             channel_reduction=None, topk=0, alpha=alpha)
    return draw_label(vis, drawn, label, xy)


def visualize_attention(inputs: str, model: str, checkpoint: Optional[str], out_dir: str, *,
                        attention: str = 'auto', blocks: Optional[Sequence[int]] = None,
                        patch: Optional[str] = None, threshold: Optional[float] = None,
                        classifier: Optional[str] = None, input_size: Optional[int] = None,
                        alpha: float = 0.5, save_arrays: bool = False,
                        vis_backends: Optional[Sequence[dict]] = None,
                        cfg_options: Optional[dict] = None, device: Optional[str] = None,
                        log: Callable[[str], None] = print) -> List[str]:
    """Draw the attention of every image of ``inputs`` (``tools/analysis/attention_vis.py``).

    Per map, head and the heads' mean: ``out_dir/<name>_0.png`` (mmengine's local vis backend;
    the other ``vis_backends`` get them too) and with ``save_arrays`` ``out_dir/<name>_0.npz``
    (``AttentionPicture.arrays``). Everything is checked, and the first image's maps drawn,
    before anything is written.

    Args:
        inputs (str): An image file or a folder of them.
        model, checkpoint, attention, blocks, classifier, input_size, cfg_options, device, log:
            As ``AttentionDrawer`` takes them.
        out_dir (str): Where the files go.
        patch, threshold, alpha: As ``AttentionDrawer.__call__`` takes them.
        save_arrays (bool): Also the ``.npz`` files. Default: False.
        vis_backends (Sequence[dict], optional): mmengine vis backend configs. Default: the
            config's (a config), none (a classifier); a local one into ``out_dir`` always.

    Returns:
        list[str]: The files written (each PNG, then its ``.npz``).

    Raises:
        VisualizationError: Bad input (an unreadable image, a block the model has not, an
            attention it does not compute), in one line; nothing is written then.
    """
    _check_threshold(threshold)
    check_alpha(alpha)
    files = list_images(inputs)
    drawer = AttentionDrawer(model, checkpoint, attention=attention, blocks=blocks,
                             classifier=classifier, input_size=input_size,
                             cfg_options=cfg_options, device=device, log=log)
    if vis_backends is None and drawer.inferencer is not None:
        vis_backends = (drawer.inferencer.cfg.get('visualizer') or {}).get('vis_backends')

    def pictures(path):
        return [(p.name, p.image, p.arrays)
                for p in drawer(path, patch=patch, threshold=threshold, alpha=alpha)]
    return write_pictures(files, pictures, out_dir, vis_backends, save_arrays)
