"""timm's other columnar transformers as pyramid backbones: ViT (with DeiT, DeiT III, AugReg,
DINOv2), EVA-02 and BEiT.

Each family is one timm module (``vision_transformer``, ``eva``, ``beit``) and takes any model
name that module registers, at any size timm has: the arch table is timm's registry, read when a
name is asked for (``TimmArchTable``: the model built on the meta device gives its width, depth,
heads and patch size). The taps are timm's ``forward_intermediates`` (raw block outputs, no final
norm), at the blocks the XCiT paper taps (1/3, 1/2, 2/3 and the end of the trunk: 3/5/7/11 of 12
blocks, 7/11/15/23 of 24) or, with ``pyramid='simple'``, ViTDet's single last block
(``ColumnarBackbone``). Blocks after the last tap are not built.

What differs between the families, and why it is written here:

* **Any input size.** timm's ``VisionTransformer`` and ``Eva`` take ``dynamic_img_size``: the
  position embedding (EVA-02: also its rotary embedding) is resampled to each input's patch grid
  by timm. timm's ``Beit`` has no such option: its relative position bias is built for one grid
  (``img_size``), so a BEiT backbone takes inputs up to ``img_size`` (zero-padded to it) and
  refuses larger ones, saying which ``img_size`` to build; a checkpoint trained at another
  resolution is resized to the built grid at load by timm's ``checkpoint_filter_fn``.
* **Patch 14** (DINOv2, EVA-02, ViT-H): the pyramid's strides are powers of two, so the taps (on
  the 14-pixel grid, the input padded to a multiple of 14 by timm) are resampled bilinearly to
  the 16-pixel grid of the padded input before the adapter: level ``s`` is then ``H/s`` as for
  every other family.
* **Stochastic depth.** timm's rate grows linearly over the blocks. When the blocks after the
  last tap are not built, the rate given to timm is scaled so that every built block keeps the
  rate it has in the full-depth model. The default is ViTDet's for the depth: 0.1 up to 12
  blocks, 0.4 up to 24, 0.5 beyond (ViT-B/L/H).
* **LayerScale** stays as each timm name builds it (``layer_scale_init`` overrides it where the
  model has LayerScale: DeiT III, DINOv2, BEiT).
"""
import functools
import math
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import to_2tuple
from timm.models import beit, eva, vision_transformer

from ....registry import register_model
from ..arch_table import ArchTable
from ..arguments import ColumnarArgs, even_taps
from ..columnar import ColumnarBackbone
from ..families import count_blocks
from ..timm_releases import create_model
from ..windows import WindowArgs, Windowed, check_windows
from .window_attention import use_windows

__all__ = ['TimmArchTable', 'TimmColumnar', 'TimmViT', 'TimmEVA', 'TimmBEiT']


def vitdet_drop_path(depth: int) -> float:
    """ViTDet's stochastic depth for a ``depth``-block ViT (B: 12 -> 0.1, L: 24 -> 0.4, H: 32 ->
    0.5; Li et al., ECCV 2022, appendix A.2)."""
    return 0.1 if depth <= 12 else 0.4 if depth <= 24 else 0.5


class TimmArchTable(ArchTable):
    """The arch table of a timm family: every model name timm's ``modules`` register (read when
    the table is first looked into), with ViTDet's settings for the depth (stochastic depth,
    ``vitdet_drop_path``; the taps at 1/3, 1/2, 2/3 and the end).

    Args:
        modules (tuple[str]): The timm modules, e.g. ``('vision_transformer', 'deit')``.
        examples (tuple[str]): Names for messages and docs; the archs a checkpoint's arch is
            looked for among (each name of timm's modules read would build a model, on meta).
    """

    def __init__(self, *modules: str, examples: Tuple[str, ...] = ()) -> None:
        self.modules = modules
        self._examples = tuple(examples)
        super().__init__(
            lambda: {n: n for n in sorted(n for m in modules for n in timm.list_models(module=m))},
            _vitdet_settings)

    @property
    def examples(self) -> Tuple[str, ...]:
        return self._examples

    def valid_names(self) -> str:
        examples = ', '.join(repr(n) for n in self.examples)
        modules = ' and '.join(self.modules)
        return (f"any of the {len(self)} names of timm's {modules} (timm.list_models("
                f"module=...) of timm {timm.__version__}), e.g. {examples}")


def _vitdet_settings(name: str, read: Dict[str, Any]) -> Dict[str, Any]:
    depth = read['depth']
    return dict(drop_path_rate=vitdet_drop_path(depth), eta=None, out_indices=even_taps(depth))


class TimmColumnar(ColumnarBackbone):
    """A timm columnar transformer with ``forward_intermediates`` as a pyramid backbone.

    Families set ``arch_zoo = TimmArchTable(<timm module>, examples=...)``, ``classifier_parts``,
    ``checkpoint_filter``, ``block_type`` and ``trunk_options`` (what timm needs to take any
    input size). Nothing here has a faster forward (no ``fast_path_name``).

    Args:
        arch (str): timm's model name (a pretrained tag such as ``.augreg_in21k`` is ignored).
        kwargs: ``ColumnarBackbone``'s arguments, and more arguments of the timm model
            (``img_size``: the position embedding's resolution, ``attn_drop_rate``, ...).
    """
    #: arguments of the timm model that every backbone of the family is built with
    trunk_options: ClassVar[Dict[str, object]] = {}

    def _build_trunk(self, args: ColumnarArgs) -> nn.Module:
        return self._create_trunk(args)

    def _create_trunk(self, args: ColumnarArgs, **options) -> nn.Module:
        """timm's model of ``args`` with its first ``kept_blocks`` blocks, built with the
        family's ``trunk_options`` and ``options`` over ``args.trunk_kwargs``."""
        spec, kept = args.spec, args.kept_blocks
        drop_path_rate = args.drop_path_rate
        if kept < spec.depth:  # the rates of the first `kept` of `depth` linearly growing ones
            drop_path_rate = drop_path_rate * (kept - 1) / (spec.depth - 1)
        kwargs = dict(args.trunk_kwargs, **options)
        if args.layer_scale is not None:
            kwargs['init_values'] = args.layer_scale
        return create_model(spec.timm, pretrained=False, num_classes=0, depth=kept,
                            drop_path_rate=drop_path_rate, **{**self.trunk_options, **kwargs})

    def _stem_modules(self) -> List[nn.Module]:
        # the patch embedding, and what runs between it and the blocks: a pre-norm (CLIP-style
        # ViTs), a shared relative position bias (BEiT), a rotary embedding (EVA-02: buffers)
        names = ('patch_embed', 'norm_pre', 'rel_pos_bias', 'rope')
        return [m for m in (getattr(self.trunk, n, None) for n in names)
                if isinstance(m, nn.Module) and not isinstance(m, nn.Identity)]

    def _stem_parameters(self) -> List[nn.Parameter]:
        # position embedding, class / distillation / register tokens
        names = ('pos_embed', 'cls_token', 'dist_token', 'reg_token')
        return [p for p in (getattr(self.trunk, n, None) for n in names)
                if isinstance(p, nn.Parameter)]

    def _forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        trunk = self.trunk
        # timm's forward_intermediates checkpoints its blocks without asking whether gradients
        # are wanted; without them (inference, FLOP counting on the meta device, where torch
        # 2.1's checkpoint fails) the blocks run plainly
        checkpointing = trunk.grad_checkpointing
        trunk.grad_checkpointing = checkpointing and torch.is_grad_enabled()
        try:
            taps = trunk.forward_intermediates(x, indices=list(self.out_indices), norm=False,
                                               stop_early=True, intermediates_only=True)
        finally:
            trunk.grad_checkpointing = checkpointing
        return self._at_tap_stride(taps, x.shape[-2:])

    def _at_tap_stride(self, taps: List[torch.Tensor], size) -> List[torch.Tensor]:
        """The taps of an input of ``size`` (its height and width), on the grid of ``tap_stride``
        (resampled from the patch grid where the patch is not a power of two)."""
        if self.tap_stride == self.patch_size:
            return list(taps)
        size = (-(-size[0] // self.tap_stride), -(-size[1] // self.tap_stride))
        return [F.interpolate(t, size=size, mode='bilinear', align_corners=False) for t in taps]

    @classmethod
    def state_dict_traits(cls, state_dict: Mapping[str, torch.Tensor]) -> Optional[Dict[str, int]]:
        if not cls._looks_like(state_dict):
            return None
        return dict(embed_dim=state_dict['trunk.blocks.0.norm1.weight'].shape[0],
                    depth=count_blocks(state_dict))

    @staticmethod
    def _looks_like(state_dict: Mapping[str, torch.Tensor]) -> bool:
        return False


@register_model
class TimmViT(Windowed, TimmColumnar):
    """timm's ``VisionTransformer`` for dense prediction: ViT (AugReg), DeiT, DeiT III, DINOv2
    (with or without registers) and every other name of ``timm.models.vision_transformer`` and
    ``timm.models.deit``.

    Any input size (timm's ``dynamic_img_size``: the position embedding is resampled to each
    input's grid). Class, distillation and register tokens go through the blocks as in timm; the
    taps are the patch tokens.

    **Windowed attention** (ViTDet): with ``window_size > 0`` every block but ``global_blocks``
    attends within ``window_size x window_size`` windows of patches (``window_attention``). As in
    ViTDet the trunk then has no class or register tokens: a checkpoint's class token is dropped
    (the load report says so) and its position embedding keeps only the patches' entries.

    Args:
        arch (str): timm's name, e.g. ``'vit_base_patch16_224'``, ``'deit3_small_patch16_224'``,
            ``'vit_small_patch14_reg4_dinov2'``. Default: ``'vit_base_patch16_224'``.
        window_size (int): 0: global attention in every block (timm's model). ``k > 0``: the
            blocks other than ``global_blocks`` attend within ``k x k`` windows (ViTDet: 14, the
            224-pretraining grid of patch 16). Default: 0.
        global_blocks (Sequence[int], optional): 0-based blocks that keep global attention when
            ``window_size > 0``. Default: ViTDet's, the last of each quarter of the trunk
            (2, 5, 8, 11 of 12 blocks; 5, 11, 17, 23 of 24).
        kwargs: See ``TimmColumnar`` and ``ColumnarBackbone``.
    """
    arch_zoo = TimmArchTable(
        'vision_transformer', 'deit',
        examples=('vit_tiny_patch16_224', 'vit_small_patch16_224', 'vit_base_patch16_224',
                  'vit_large_patch16_224', 'deit_small_patch16_224', 'deit3_small_patch16_224',
                  'vit_small_patch14_dinov2', 'vit_base_patch14_reg4_dinov2'))
    trunk_options = dict(dynamic_img_size=True, dynamic_img_pad=True)
    classifier_parts = ('norm', 'fc_norm', 'head', 'head_dist', 'attn_pool')
    checkpoint_filter = staticmethod(vision_transformer.checkpoint_filter_fn)
    block_type = vision_transformer.Block

    def __init__(self, arch: str = 'vit_base_patch16_224', *, window_size: int = 0,
                 global_blocks: Optional[Sequence[int]] = None, **kwargs) -> None:
        super().__init__(arch, window_size=window_size, global_blocks=global_blocks, **kwargs)

    @classmethod
    def parse_args(cls, arch: str, *, window_size: int = 0,
                   global_blocks: Optional[Sequence[int]] = None, **kwargs) -> ColumnarArgs:
        args = super().parse_args(arch, **kwargs)
        return args.with_family(WindowArgs(*check_windows(
            'TimmViT', args.arch, window_size, global_blocks, args.kept_blocks,
            default=cls._vitdet_global(args))))

    @staticmethod
    def _vitdet_global(args: ColumnarArgs) -> Tuple[int, ...]:
        """ViTDet's global blocks: the last of each quarter of the full trunk, where built."""
        q, depth = args.spec.depth // 4, args.spec.depth
        return tuple(i for i in (q - 1, 2 * q - 1, 3 * q - 1, depth - 1) if i < args.kept_blocks)

    def _build_trunk(self, args: ColumnarArgs) -> nn.Module:
        windows: WindowArgs = args.family
        if not windows.window_size:
            return self._create_trunk(args)
        try:  # ViTDet: patch tokens only
            trunk = self._create_trunk(args, class_token=False, reg_tokens=0, global_pool='avg')
        except AssertionError as e:  # timm's distilled ViTs need their class token
            raise ValueError(f'TimmViT({args.spec.timm}): window_size needs a trunk of patch '
                             f'tokens only, which timm does not build for this model ({e}): use '
                             'window_size=0 or another ViT.') from e
        if trunk.num_prefix_tokens:
            raise ValueError(f'TimmViT({args.spec.timm}): window_size needs a trunk of patch '
                             f'tokens only, and this one keeps {trunk.num_prefix_tokens} (a '
                             'distillation token): use window_size=0 or another ViT.')
        for i, blk in enumerate(trunk.blocks):  # the tokens go through them as a grid
            try:
                use_windows(blk.attn, windows.window_of(i))
            except TypeError as e:
                raise ValueError(f'TimmViT({args.arch}): {e}') from e
        return trunk

    def _forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        if not self.window_size:
            return super()._forward_taps(x)
        # timm's forward_intermediates, the tokens kept as a (B, h, w, C) grid for the windows
        trunk, size = self.trunk, x.shape[-2:]
        x = trunk.patch_embed(x)  # (B, h, w, C): dynamic_img_size
        B, h, w, C = x.shape
        x = trunk.norm_pre(trunk.patch_drop(trunk._pos_embed(x))).reshape(B, h, w, C)
        return self._at_tap_stride(self._grid_taps(x), size)

    # ----------------------------------------------------------------- weights
    def convert_trunk_keys(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        state_dict = dict(state_dict)
        pos = state_dict.get('pos_embed')
        if self.window_size and pos is not None and pos.dim() == 3:
            # no class / register tokens here: keep the patches' entries of the embedding (timm's
            # filter resamples them); the tokens themselves are dropped (dropped_key_patterns)
            n = pos.shape[1]
            extra = n - math.isqrt(n) ** 2
            if extra and not getattr(self.trunk, 'no_embed_class', False):
                state_dict['pos_embed'] = pos[:, extra:]
        return super().convert_trunk_keys(state_dict)

    def dropped_key_patterns(self) -> List[str]:
        pats = super().dropped_key_patterns()
        if self.window_size:
            pats.append(r'^trunk\.(cls_token|reg_token|dist_token)$')
        return pats

    @staticmethod
    def _looks_like(state_dict: Mapping[str, torch.Tensor]) -> bool:
        # EVA-02 and BEiT keep the query and value biases apart (attn.q_bias); CaiT mixes heads
        return 'trunk.blocks.0.attn.qkv.weight' in state_dict and 'trunk.pos_embed' in state_dict \
            and 'trunk.blocks.0.attn.proj_l.weight' not in state_dict \
            and 'trunk.blocks.0.attn.q_bias' not in state_dict


@register_model
class TimmEVA(TimmColumnar):
    """timm's ``Eva`` for dense prediction: EVA-02 (rotary position embedding, SwiGLU MLP) and
    every other name of ``timm.models.eva``.

    Any input size (timm's ``dynamic_img_size``: the absolute and the rotary position embeddings
    follow each input's grid).

    Args:
        arch (str): timm's name, e.g. ``'eva02_tiny_patch14_224'``, ``'eva02_base_patch14_448'``.
            Default: ``'eva02_base_patch14_448'``.
        kwargs: See ``TimmColumnar`` and ``ColumnarBackbone``.
    """
    arch_zoo = TimmArchTable(
        'eva', examples=('eva02_tiny_patch14_224', 'eva02_small_patch14_224',
                         'eva02_base_patch14_224', 'eva02_base_patch14_448',
                         'eva02_large_patch14_448'))
    trunk_options = dict(dynamic_img_size=True, dynamic_img_pad=True)
    classifier_parts = ('norm', 'fc_norm', 'head')
    checkpoint_filter = staticmethod(eva.checkpoint_filter_fn)
    block_type = (eva.EvaBlock, eva.EvaBlockPostNorm)

    def __init__(self, arch: str = 'eva02_base_patch14_448', **kwargs) -> None:
        super().__init__(arch, **kwargs)

    @staticmethod
    def _looks_like(state_dict: Mapping[str, torch.Tensor]) -> bool:
        # separate projections, or a fused one with the query and value biases apart (as BEiT,
        # which has relative position bias tables besides)
        apart = any(k.startswith('trunk.blocks.0.attn.q_proj.') for k in state_dict) \
            or 'trunk.blocks.0.attn.q_bias' in state_dict
        return apart and 'trunk.blocks.0.norm1.weight' in state_dict \
            and not any('relative_position_bias_table' in k for k in state_dict)


@functools.cache
def _sdpa_takes_float_masks_under_autocast() -> bool:
    """Whether ``F.scaled_dot_product_attention`` accepts a float32 additive mask beside bfloat16
    queries under CPU autocast, as timm's BEiT passes its relative position bias: torch 2.13 casts
    them, torch 2.1 refuses ("Expected attn_mask dtype to be bool or to match query dtype").
    Probed once on two tiny CPU tensors."""
    q = torch.zeros(1, 1, 2, 2, dtype=torch.bfloat16)  # as a Linear's output under autocast
    try:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            F.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(2, 2))
    except RuntimeError:
        return False
    return True


@register_model
class TimmBEiT(TimmColumnar):
    """timm's ``Beit`` for dense prediction: BEiT, BEiT v2 and every other name of
    ``timm.models.beit``.

    timm's BEiT runs at one patch grid (its relative position bias is built for it): inputs up to
    ``img_size`` are zero-padded at the bottom/right to ``img_size``, so every level is
    ``img_size / s``; larger inputs are refused. Build it at the size the recipe feeds (e.g.
    ``img_size=512`` for 512x512 ADE20k crops and sliding-window inference); a checkpoint of
    another resolution has its relative position bias resized at load (timm's
    ``checkpoint_filter_fn``).

    Args:
        arch (str): timm's name, e.g. ``'beit_base_patch16_224'``, ``'beitv2_base_patch16_224'``.
            Default: ``'beit_base_patch16_224'``.
        img_size (int | tuple[int, int], optional): The input size the model takes. Default: the
            resolution of ``arch``.
        kwargs: See ``TimmColumnar`` and ``ColumnarBackbone``.
    """
    arch_zoo = TimmArchTable(
        'beit', examples=('beit_base_patch16_224', 'beitv2_base_patch16_224',
                          'beit_large_patch16_512'))
    classifier_parts = ('norm', 'fc_norm', 'head')
    checkpoint_filter = staticmethod(beit.checkpoint_filter_fn)
    block_type = beit.Block

    def __init__(self, arch: str = 'beit_base_patch16_224', **kwargs) -> None:
        super().__init__(arch, **kwargs)
        if not _sdpa_takes_float_masks_under_autocast():
            # torch 2.1's fused attention refuses BEiT's float relative position bias beside
            # half-precision queries (mixed precision): timm's unfused attention, the same math
            for blk in self.trunk.blocks:
                blk.attn.fused_attn = False
        self.img_size = tuple(to_2tuple(self.trunk.patch_embed.img_size))
        for s in self.img_size:
            if s % self.pad_to:
                raise ValueError(f'TimmBEiT({self.arch}): img_size={self.img_size} must be a '
                                 f'multiple of the largest stride {self.pad_to}, e.g. '
                                 f'{-(-s // self.pad_to) * self.pad_to}.')

    def _padded_size(self, h: int, w: int) -> Tuple[int, int]:
        H, W = self.img_size
        if h > H or w > W:
            raise ValueError(
                f'TimmBEiT({self.arch}): input {h}x{w} is larger than the {H}x{W} the model is '
                f'built for (timm\'s BEiT runs at one patch grid: its relative position bias). '
                f'Build it with img_size={math.ceil(max(h, w) / self.pad_to) * self.pad_to} (or '
                f'larger), or feed crops of at most {H}x{W}.')
        return H, W

    def _forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        if tuple(x.shape[-2:]) != self.img_size:
            raise ValueError(f'TimmBEiT({self.arch}): with pad_input=False the input must be '
                             f'{self.img_size[0]}x{self.img_size[1]} (the size the model is built '
                             f'for), got {tuple(x.shape[-2:])}; use pad_input=True.')
        return super()._forward_taps(x)

    @staticmethod
    def _looks_like(state_dict: Mapping[str, torch.Tensor]) -> bool:
        return any('relative_position_bias_table' in k for k in state_dict) \
            and 'trunk.blocks.0.norm1.weight' in state_dict
