"""CaiT backbone: Going deeper with Image Transformers (Touvron et al., ICCV 2021).

Built on timm's ``Cait`` (talking-heads self-attention, LayerScale, learned absolute position
embedding); the class-attention stage, class token, final norm and head are not built (timm's
``prune_intermediate_layers``). Sizes follow the paper's Table 3 (``d = 48 x heads``), stochastic
depth and LayerScale init its Table 4. Taps are raw block outputs at 1/3, 1/2, 2/3 and the end of
the trunk (0-based 7/11/15/23 for 24 blocks, 11/17/23/35 for 36, 15/23/31/47 for 48).

What dense prediction adds to timm's model, and why it is written here:

* **Any input size.** timm 1.0's ``Cait`` has no ``dynamic_img_size`` (unlike its
  ``VisionTransformer``): ``forward_intermediates`` adds ``pos_embed`` as stored, so it only runs at
  the grid it was built for. ``_forward_taps`` is therefore the few lines of that loop (timm's patch
  embedding, the position embedding resampled to the input's patch grid with timm's
  ``resample_abs_pos_embed``, bicubic, timm's blocks and ``checkpoint``), and equals timm's
  ``forward_intermediates`` at the model's own grid (tested to 1e-5).
* **The checkpoint's grid.** ``pos_embed`` has the grid the model is built for
  (``img_size / 16``: 14x14 by default, 24x24 for ``cait_*_384`` or ``img_size=384``). A checkpoint
  trained at another resolution is resampled to it once, at load (its grid is read from its
  shape; the load report's ``resized`` line and a warning say so), on every loading path (they all
  go through ``deepvit_mm.checkpoints.load_weights``). Build the model at
  the checkpoint's resolution to keep the embedding as trained. The parameter's shape never
  changes after construction: mmengine wraps the model in DistributedDataParallel before it loads
  the weights, and DDP's gradient hooks keep the shape they saw.
* **Windowed attention** (ViTDet): with ``window_size > 0`` every block except ``global_blocks``
  (default: the tapped blocks) attends within windows (``GridTalkingHeadAttn``, timm's attention on
  window-partitioned tokens). Tokens travel through the blocks as a ``(B, H, W, C)`` grid so that
  the attention knows the layout; timm's LayerNorm, MLP, LayerScale and drop path work on it as is.
* **Query chunks** (``query_chunks``): the talking-heads attention without its ``heads x N x N``
  maps (``window_attention.talking_heads_chunked``).
"""
import dataclasses
import logging
import math
import re
from collections import OrderedDict
from functools import partial
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint
from mmengine.logging import print_log
from timm.layers import PatchEmbed, resample_abs_pos_embed
from timm.models.cait import Cait, LayerScaleBlock, checkpoint_filter_fn

from ....registry import register_model
from ....tracing import capturing_for_other_sizes
from ..adapt import adapt
from ..arch_table import ArchTable
from ..arguments import ColumnarArgs, even_taps
from ..columnar import ColumnarBackbone
from ..families import count_blocks
from ..windows import WindowArgs, Windowed, check_windows
from .window_attention import CPU_QUERY_CHUNK, GridTalkingHeadAttn, default_query_chunk

__all__ = ['CaiT', 'CaiTArgs']

# Resampled position embeddings kept per model for inference (one per input grid seen).
_POS_CACHE_SIZE = 8


# The paper's settings of each arch (Tables 3 and 4): stochastic depth (uniform over blocks) and
# LayerScale eps; timm's model where timm registers the arch (at the resolution of the official
# release), else the paper's width and depth (XS36, S48, M24: no timm name nor released weights,
# built from the same ``Cait`` class) with 16-pixel patches and a head per 48 channels (section 4.3)
_CAIT_SETTINGS = {  # name: (timm name or (embed_dim, depth), drop_path_rate, eps)
    'xxs24': ('cait_xxs24_224', 0.05, 1e-5),
    'xxs36': ('cait_xxs36_224', 0.1, 1e-6),
    'xs24': ('cait_xs24_384', 0.05, 1e-5),
    'xs36': ((288, 36), 0.1, 1e-6),
    's24': ('cait_s24_224', 0.1, 1e-5),
    's36': ('cait_s36_384', 0.2, 1e-6),
    's48': ((384, 48), 0.3, 1e-6),
    'm24': ((768, 24), 0.2, 1e-5),
    'm36': ('cait_m36_384', 0.3, 1e-6),
    'm48': ('cait_m48_448', 0.4, 1e-6),
}


def _cait_settings(name: str, read: Dict[str, Any]) -> Dict[str, Any]:
    model, drop_path_rate, eps = _CAIT_SETTINGS[name]
    paper = {} if read else dict(embed_dim=model[0], depth=model[1], patch_size=16,
                                 num_heads=model[0] // 48)  # the paper's arch that timm has not
    return dict(paper, drop_path_rate=drop_path_rate, eta=eps,
                out_indices=even_taps((read or paper)['depth']))


@dataclasses.dataclass(frozen=True)
class CaiTArgs(WindowArgs):
    """CaiT's own arguments, checked: its windows, and the resolution its position embedding is
    built for (``img_size``, square)."""
    img_size: int


@register_model
class CaiT(Windowed, ColumnarBackbone):
    """CaiT for dense prediction: trunk (timm) -> 4 taps -> strides 4/8/16/32.

    The position embedding is built for ``img_size`` (grid ``img_size / 16``) and resampled to each
    input's grid, so inputs of any size work; a checkpoint trained at another resolution is
    resampled to it at load. ``query_chunks`` computes the talking-heads attention by chunks of
    query rows (``window_attention.talking_heads_chunked``: the same result and gradients, no
    ``heads x N x N`` maps); ``'auto'`` does so on CPUs, 128 rows a chunk, for attention over more
    than 128 tokens, and runs timm's attention elsewhere and under active attention dropout in
    training (docs/cait.md#query-chunked-attention).

    Args:
        arch (str): ``xxs24``, ``xxs36``, ``xs24``, ``xs36``, ``s24``, ``s36``, ``s48``, ``m24``,
            ``m36``, ``m48``, or timm's name such as ``cait_s24_384`` (its resolution then sets
            ``img_size``). Default: ``'s24'``.
        out_indices (Sequence[int], optional): 0-based taps. Default: blocks at 1/3, 1/2, 2/3 and
            the end of the trunk, e.g. (7, 11, 15, 23) for 24 blocks.
        out_strides (Sequence[int]): Pyramid strides. Default: (4, 8, 16, 32).
        drop_path_rate (float, optional): Stochastic depth, uniform over blocks as in the paper.
            Default: Table 4's value for ``arch``.
        layer_scale_init (float, optional): LayerScale init eps. Default: Table 4's value.
        img_size (int, optional): Resolution the position embedding is built for; the
            checkpoint's (384 for the ``_384`` releases) keeps its embedding as trained.
            Default: the resolution in a timm ``arch`` name, else 224.
        window_size (int): 0: global attention in every block (the classification model).
            ``k > 0``: blocks other than ``global_blocks`` attend within ``k x k`` windows of
            patches (ViTDet); 14 is the 224-pretraining grid. Default: 0.
        global_blocks (Sequence[int], optional): 0-based blocks that keep global attention when
            ``window_size > 0``. Default: ``out_indices``.
        query_chunks (bool | str): Attention by chunks of query rows: ``'auto'`` (on CPUs),
            ``True`` (every device) or ``False`` (timm's attention). Default: ``'auto'``.
        norm_cfg (dict): Norm of ``ColumnarPyramid``. Default: ``dict(type='BN', requires_grad=True)``.
        frozen_stages (int): See ``ColumnarBackbone`` (0 freezes the patch and position
            embeddings). Default: -1.
        norm_eval (bool): See ``ColumnarBackbone``. Default: False.
        with_cp (bool): Gradient checkpointing of every block. Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)``: an official CaiT
            release (``{'model': ...}``), a timm ``.pth``/``.safetensors``, or a detector/segmentor
            checkpoint.
        trunk_kwargs: More timm ``Cait`` arguments (``attn_drop_rate``, ``in_chans``...).
    """
    arch_zoo = ArchTable(lambda: {n: (t if isinstance(t, str) else None)
                                  for n, (t, _, _) in _CAIT_SETTINGS.items()}, _cait_settings,
                         name_pattern=r'(?:cait_)?((?:xxs|xs|s|m)(?:24|36|48))(?:_(?:224|384|448))?')

    classifier_parts = ('cls_token', 'blocks_token_only', 'norm', 'head')
    # official releases ({'model': ...}, maybe `module.`) have timm's keys
    checkpoint_filter = staticmethod(checkpoint_filter_fn)
    fast_path_name = 'query_chunks'
    block_type = LayerScaleBlock
    query_chunks = property(ColumnarBackbone._get_fast_path, ColumnarBackbone._set_fast_path,
                            doc="``'auto'``, True or False: see the class docstring.")

    def __init__(self, arch: str = 's24', *, img_size: Optional[int] = None, window_size: int = 0,
                 global_blocks: Optional[Sequence[int]] = None,
                 query_chunks: Union[bool, str] = 'auto', **kwargs) -> None:
        super().__init__(arch, img_size=img_size, window_size=window_size,
                         global_blocks=global_blocks, **kwargs)
        # inference-only cache of resampled position embeddings; see `pos_embed_for`
        self._pos_cache: Dict[Tuple[int, int], torch.Tensor] = OrderedDict()
        self._pos_cache_stamp: Optional[tuple] = None
        self.query_chunks = query_chunks

    @classmethod
    def parse_args(cls, arch: str, *, img_size: Optional[int] = None, window_size: int = 0,
                   global_blocks: Optional[Sequence[int]] = None, **kwargs) -> ColumnarArgs:
        img_size = cls._check_img_size(arch, img_size)
        args = super().parse_args(arch, **kwargs)
        return args.with_family(CaiTArgs(*check_windows(
            'CaiT', args.arch, window_size, global_blocks, args.kept_blocks,
            default=args.out_indices), img_size=img_size))

    def _apply_fast_path(self, mode: Union[bool, str]) -> None:
        chunk = {True: CPU_QUERY_CHUNK, False: None, 'auto': 'auto'}[mode]
        for blk in self.trunk.blocks:
            blk.attn.query_chunk = chunk

    # ----------------------------------------------------------------- construction
    @staticmethod
    def _check_img_size(arch, img_size) -> int:
        if img_size is None:
            m = re.search(r'_(\d+)$', str(arch).strip().lower().split('.')[0])
            return int(m.group(1)) if m else 224
        if isinstance(img_size, (tuple, list)):
            if len(img_size) != 2 or img_size[0] != img_size[1]:
                raise ValueError(f'CaiT: img_size={tuple(img_size)} must be square (one int): a '
                                 'checkpoint stores its position embedding as a flat list of '
                                 'patches and only a square grid can be recovered from it. Inputs '
                                 'of any shape still work (the embedding is resampled).')
            img_size = img_size[0]
        if int(img_size) < 16:
            raise ValueError(f'CaiT: img_size={img_size} is smaller than one 16x16 patch.')
        return int(img_size)

    def _stem_parameters(self) -> List[nn.Parameter]:
        return [self.trunk.pos_embed]  # the learned position embedding

    def _compiled_modules(self) -> List[nn.Module]:
        # the MLPs only: the attention's loop over query chunks runs as many times as the token
        # count asks, and dynamo unrolls it into a graph per count (Mask R-CNN 3x sizes,
        # XXS24's first 4 blocks, aot_eager: 5 graphs for 4 sizes;
        # docs/training.md#compiling-the-backbone)
        return [blk.mlp for blk in self.trunk.blocks]

    def _build_trunk(self, args: ColumnarArgs) -> nn.Module:
        spec, family = args.spec, args.family
        trunk = Cait(
            img_size=family.img_size, patch_size=spec.patch_size, embed_dim=spec.embed_dim,
            # blocks after the last tap would be pruned right away: not built (nor initialised);
            # drop path is uniform over blocks, so nothing else depends on the depth
            depth=args.kept_blocks, num_heads=spec.num_heads, init_values=args.layer_scale,
            drop_path_rate=args.drop_path_rate, num_classes=0,
            # any size: the backbone pads inputs to a multiple of 32, and with pad_input=False
            # the patch embedding pads to a multiple of the patch size
            patch_layer=partial(PatchEmbed, strict_img_size=False, dynamic_img_pad=True),
            **args.trunk_kwargs)
        for i, blk in enumerate(trunk.blocks):
            adapt(blk.attn, GridTalkingHeadAttn, window_size=family.window_of(i))
        return trunk

    # ----------------------------------------------------------------- position embedding
    @property
    def pos_embed_grid(self) -> Tuple[int, int]:
        """Patch grid ``(h, w)`` of the stored position embedding (timm's ``grid_size``)."""
        return tuple(self.trunk.patch_embed.grid_size)

    def pos_embed_for(self, grid: Tuple[int, int]) -> torch.Tensor:
        """The learned position embedding resampled to a ``grid`` of patches.

        Resampling is timm's ``resample_abs_pos_embed`` (bicubic, antialiased when shrinking), as
        timm's ``VisionTransformer`` does with ``dynamic_img_size``.

        Caching: when gradients can flow into ``pos_embed`` (grad mode on and the parameter
        trainable, i.e. while training it), it is resampled on every call so that the gradient
        reaches the stored embedding. Otherwise (inference, or a frozen embedding) the result is
        cached per grid size (at most 8 sizes, least recently used first out). The cache is
        stamped with the parameter's version counter, storage, dtype and device, so any change of
        the weights (an optimizer step, ``load_state_dict``, ``.to()``, ``.half()``) invalidates it.
        While exporting (ONNX, torch.export, tracing) it is resampled inside the graph, uncached,
        so that the exported graph follows the input's size.

        Args:
            grid (tuple[int, int]): Patch grid ``(h, w)`` of the input.

        Returns:
            Tensor: ``(1, h * w, embed_dim)``.
        """
        pos = self.trunk.pos_embed
        if capturing_for_other_sizes():  # resampled in the graph at the input's grid: no cache, no int()
            return resample_abs_pos_embed(pos, new_size=list(grid), old_size=self.pos_embed_grid,
                                          num_prefix_tokens=0)
        grid = (int(grid[0]), int(grid[1]))
        old = self.pos_embed_grid
        if grid == old:
            return pos
        if torch.is_grad_enabled() and pos.requires_grad:
            return resample_abs_pos_embed(pos, new_size=grid, old_size=old, num_prefix_tokens=0)
        stamp = (pos._version, pos.data_ptr(), pos.dtype, pos.device, tuple(pos.shape),
                 torch.is_inference_mode_enabled())
        if stamp != self._pos_cache_stamp:
            self._pos_cache.clear()
            self._pos_cache_stamp = stamp
        out = self._pos_cache.get(grid)
        if out is None:
            with torch.no_grad():
                out = resample_abs_pos_embed(pos, new_size=grid, old_size=old, num_prefix_tokens=0)
            self._pos_cache[grid] = out
            if len(self._pos_cache) > _POS_CACHE_SIZE:
                self._pos_cache.popitem(last=False)
        else:
            self._pos_cache.move_to_end(grid)
        return out

    def _pos_embed_from_checkpoint(self, value: torch.Tensor) -> Optional[torch.Tensor]:
        """A checkpoint's ``(1, n*n, embed_dim)`` embedding resampled to this model's grid.

        The checkpoint's grid is read from its shape (every CaiT release is square: 14x14 at 224,
        24x24 at 384); resampling is timm's ``resample_abs_pos_embed`` (bicubic). Returns None
        (the loader then reports the mismatch) for anything else.
        """
        pos = self.trunk.pos_embed
        if value.dim() != 3 or value.shape[0] != 1 or value.shape[2] != pos.shape[2]:
            return None
        g = math.isqrt(value.shape[1])
        if g * g != value.shape[1]:
            return None
        new = self.pos_embed_grid
        with torch.no_grad():
            out = resample_abs_pos_embed(value, new_size=new, old_size=(g, g), num_prefix_tokens=0)
        print_log(f"CaiT({self.arch}): the checkpoint's position embedding ({g}x{g} patches) was "
                  f'resampled to the model\'s {new[0]}x{new[1]}; build the model with '
                  f'img_size={g * self.patch_size} to keep it as trained.', logger='current',
                  level=logging.WARNING)
        return out

    def resize_weight(self, key: str, value: torch.Tensor,
                      target: torch.Tensor) -> Optional[torch.Tensor]:
        # our loader (init_cfg): reported in the load report's `resized` line
        return self._pos_embed_from_checkpoint(value) if key == 'trunk.pos_embed' else None

    # ----------------------------------------------------------------- memory
    def _activation_bytes(self, batch: int, grid: Tuple[int, int], element: int,
                          device: torch.device) -> int:
        # global talking-heads attention: heads x rows x N maps (two live at once in inference,
        # rows = the query chunk when it applies); training keeps the full N x N maps of every
        # global block (logits, mixed, softmax), or of one block at a time with with_cp
        base = super()._activation_bytes(batch, grid, element, device)
        n = grid[0] * grid[1]
        attn = self.trunk.blocks[self.global_blocks[0]].attn
        heads = attn.num_heads
        if torch.is_grad_enabled() and self.training:
            blocks = 1 if self.with_cp else len(self.global_blocks)
            return base + blocks * batch * heads * n * n * element * 3
        chunk = default_query_chunk(device) if attn.query_chunk == 'auto' else attn.query_chunk
        rows = min(chunk, n) if chunk else n
        return base + batch * heads * rows * n * element * 2

    def _memory_remedy(self) -> str:
        return ('use windowed attention (window_size=14), with_cp=True for training, or smaller '
                'inputs')

    # ----------------------------------------------------------------- forward
    def _forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        # timm's Cait.forward_intermediates, with the position embedding resampled to the input's
        # grid and the tokens kept as a (B, h, w, C) grid for windowed attention
        B, _, H, W = x.shape
        grid = (-(-H // self.patch_size), -(-W // self.patch_size))
        trunk = self.trunk
        x = trunk.patch_embed(x) + self.pos_embed_for(grid)
        return self._grid_taps(trunk.pos_drop(x).reshape(B, grid[0], grid[1], -1),
                               as_blocks_end=True)

    # ----------------------------------------------------------------- weights
    @classmethod
    def state_dict_traits(cls, state_dict: Mapping[str, torch.Tensor]) -> Optional[Dict[str, int]]:
        if 'trunk.blocks.0.attn.proj_l.weight' not in state_dict \
                or 'trunk.blocks.0.gamma_1' not in state_dict:
            return None
        return dict(embed_dim=state_dict['trunk.blocks.0.gamma_1'].shape[0],
                    depth=count_blocks(state_dict))
