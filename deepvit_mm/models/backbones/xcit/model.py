"""XCiT backbone: Cross-Covariance Image Transformers (Ali et al., NeurIPS 2021).

Built on timm's ``Xcit`` (cross-covariance attention, local patch interaction, conv patch
embedding, Fourier position encoding, LayerScale); the class-attention blocks, class token, final
norm and head are not built. Taps are raw block outputs, as in the paper's detection code
(appendix B.2): blocks 4/6/8/12 of 12-layer models, 8/12/16/24 of 24-layer ones.
Stochastic depth and LayerScale init follow the paper's Table B.1.

The Q/K/V embedding of XCA is an option (``qkv_cfg``): timm's linear layer by default, or the
non-linear SNE, P-SNE and F-SNE embeddings of "Non-linear Q, K, V embeddings" (``.qkv``).
"""
import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Union

import timm
import torch
import torch.nn as nn
from timm.models.xcit import checkpoint_filter_fn

from ....registry import register_model
from ..adapt import adapt
from ..arch_table import ArchTable
from ..arguments import ColumnarArgs, even_taps
from ..columnar import ColumnarBackbone
from ..families import count_blocks
from .fast import AutoGramXCABlock, CompiledAutoGramXCABlock, GramXCABlock
from .qkv import normalize_qkv_cfg, qkv_cfg_from_state_dict, set_qkv_embed

__all__ = ['XCiT', 'XCiTArgs']


# The paper's settings of each arch (Tables 1 and B.1; L24/8's from the official detection and
# segmentation configs): stochastic depth (constant over blocks) and LayerScale eta; widths and
# depths are timm's models'
_XCIT_SETTINGS = {
    'nano_12_p8': (0.0, 1.0), 'nano_12_p16': (0.0, 1.0),
    'tiny_12_p8': (0.0, 1.0), 'tiny_12_p16': (0.0, 1.0),
    'tiny_24_p8': (0.05, 1e-5), 'tiny_24_p16': (0.05, 1e-5),
    'small_12_p8': (0.05, 1.0), 'small_12_p16': (0.05, 1.0),
    'small_24_p8': (0.1, 1e-5), 'small_24_p16': (0.1, 1e-5),
    'medium_24_p8': (0.15, 1e-5), 'medium_24_p16': (0.15, 1e-5),
    'large_24_p8': (0.3, 1e-5), 'large_24_p16': (0.25, 1e-5),
}


def _xcit_settings(name: str, read: Dict[str, Any]) -> Dict[str, Any]:
    drop_path_rate, eta = _XCIT_SETTINGS[name]
    return dict(drop_path_rate=drop_path_rate, eta=eta,
                out_indices=even_taps(read['depth']))


@dataclasses.dataclass(frozen=True)
class XCiTArgs:
    """XCiT's own arguments, checked.

    Attributes:
        qkv_cfg (dict): The Q/K/V embedding of every XCA block (``xcit.qkv.normalize_qkv_cfg``'s
            form).
    """
    qkv_cfg: Mapping[str, Any]


@register_model
class XCiT(ColumnarBackbone):
    """XCiT for dense prediction: trunk (timm) -> 4 taps -> strides 4/8/16/32.

    ``gram_xca`` runs the blocks through ``xcit.fast`` (cross-covariance attention from the Gram
    matrix, contiguous LPI convs, fused LayerScale residuals, folded inference): the same
    parameters and, to float rounding, the same result as timm's ``forward_intermediates``, with
    less work on large inputs and more on small ones. ``'auto'`` decides per forward
    (``xcit.fast.fast_path_helps``: on CPUs from 2 C tokens per image, on CUDA from a batch's
    B N C^2 of 2e9 in fp32 and 4e9 in bf16/fp16; docs/speed.md#when-auto-takes-it).
    ``qkv_cfg`` replaces the linear Q/K/V embedding by a non-linear one (``xcit.qkv``); a linear
    checkpoint then loads everything else, and the load report lists the Q/K/V layers (and
    F-SNE's codes) as left at init.

    Args:
        arch (str): ``nano_12_p8``, ``tiny_24_p16``, ... (N12, T12, T24, S12, S24, M24, L24 with
            patch 8 or 16) or timm's name such as ``xcit_small_12_p8_224``.
        out_indices (Sequence[int], optional): 0-based taps. Default: (3, 5, 7, 11) for 12
            layers, (7, 11, 15, 23) for 24.
        out_strides (Sequence[int]): Pyramid strides. Default: (4, 8, 16, 32).
        drop_path_rate (float, optional): Stochastic depth (constant over blocks, as in the
            paper). Default: Table B.1's value for ``arch``.
        layer_scale_init (float, optional): LayerScale eta. Default: Table B.1's value.
        qkv_cfg (dict, optional): The Q/K/V embedding of every XCA block: ``dict(type=T)`` with
            T ``'Linear'``, ``'SNE'``, ``'PSNE'`` or ``'FSNE'`` and their options (see
            ``xcit.qkv.normalize_qkv_cfg``). Default: None (timm's linear embedding).
        gram_xca (bool | str): The faster block forward (``xcit.fast``): ``'auto'`` (where it
            helps), ``True`` (always) or ``False`` (timm's own forward). Default: ``'auto'``.
        norm_cfg (dict): Norm of the conv parts (patch embedding, LPI, ``ColumnarPyramid``).
            Default: ``dict(type='BN', requires_grad=True)``.
        frozen_stages (int): See ``ColumnarBackbone``. Default: -1.
        norm_eval (bool): See ``ColumnarBackbone``. Default: False.
        with_cp (bool): Gradient checkpointing of every block. Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)``.
        trunk_kwargs: More timm ``Xcit`` arguments (``attn_drop_rate``, ``in_chans``...).
    """
    arch_zoo = ArchTable(lambda: {n: f'xcit_{n}_224' for n in _XCIT_SETTINGS}, _xcit_settings,
                         name_pattern=r'(?:xcit_)?((?:nano|tiny|small|medium|large)_(?:12|24)'
                                      r'_p(?:8|16))(?:_(?:224|384))?(?:_dist)?')

    classifier_parts = ('cls_token', 'cls_attn_blocks', 'norm', 'head')
    # official releases: `pos_embeder.*` -> `pos_embed.*`
    checkpoint_filter = staticmethod(checkpoint_filter_fn)
    fast_path_name = 'gram_xca'
    block_type = timm.models.xcit.XCABlock
    gram_xca = property(ColumnarBackbone._get_fast_path, ColumnarBackbone._set_fast_path,
                        doc="``'auto'``, True or False: see the class docstring.")

    def __init__(self, arch: str = 'small_12_p16', *, qkv_cfg: Optional[dict] = None,
                 gram_xca: Union[bool, str] = 'auto', **kwargs) -> None:
        super().__init__(arch, qkv_cfg=qkv_cfg, **kwargs)
        self.gram_xca = gram_xca

    @classmethod
    def parse_args(cls, arch: str, *, qkv_cfg: Optional[dict] = None, **kwargs) -> ColumnarArgs:
        return super().parse_args(arch, **kwargs).with_family(XCiTArgs(normalize_qkv_cfg(qkv_cfg)))

    @property
    def qkv_cfg(self) -> dict:
        """The Q/K/V embedding of every XCA block (``xcit.qkv.normalize_qkv_cfg``'s form)."""
        return self.args.family.qkv_cfg

    def _build_trunk(self, args: ColumnarArgs) -> nn.Module:
        trunk = timm.create_model(args.spec.timm, pretrained=False, num_classes=0,
                                  drop_path_rate=args.drop_path_rate, eta=args.layer_scale,
                                  **args.trunk_kwargs)
        return set_qkv_embed(trunk, args.family.qkv_cfg)

    def _stem_modules(self) -> List[nn.Module]:
        return super()._stem_modules() + [self.trunk.pos_embed]  # the Fourier encoding's conv

    def _frozen_modules(self) -> List[nn.Module]:
        mods = super()._frozen_modules()
        # F-SNE's codes serve every block: frozen only once all the blocks used are
        if hasattr(self.trunk, 'qkv_codes') and self.frozen_stages >= self.kept_blocks:
            mods.append(self.trunk.qkv_codes)
        return mods

    def dropped_key_patterns(self) -> List[str]:
        pats = super().dropped_key_patterns()
        if self.qkv_cfg['type'] != 'Linear':  # a linear checkpoint's qkv has no place here
            pats.append(r'^trunk\.blocks\.\d+\.attn\.qkv\.(weight|bias)$')
        return pats

    def init_ok_key_patterns(self) -> List[str]:
        pats = super().init_ok_key_patterns()
        if self.qkv_cfg['type'] != 'Linear':  # non-linear Q/K/V (and codes) may start at init
            pats += [r'^trunk\.blocks\.\d+\.attn\.qkv\.', r'^trunk\.qkv_codes\.']
        return pats

    def _apply_fast_path(self, mode: Union[bool, str]) -> None:
        # each block gets the class of its forward (..adapt), so timm's own forward_intermediates
        # (its gradient checkpointing included) and forward hooks on the blocks work unchanged;
        # timm's XCABlock back restores its forward
        auto = AutoGramXCABlock if self.args.compile_blocks is None else CompiledAutoGramXCABlock
        cls = {True: GramXCABlock, 'auto': auto}.get(mode, self.block_type)
        for blk in self.trunk.blocks:
            adapt(blk, cls)

    def _forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        return self.trunk.forward_intermediates(
            x, indices=list(self.out_indices), output_fmt='NCHW', intermediates_only=True)

    @classmethod
    def state_dict_traits(cls, state_dict: Mapping[str, torch.Tensor]) -> Optional[Dict[str, int]]:
        if 'trunk.blocks.0.local_mp.conv1.weight' not in state_dict:
            return None
        # the conv stem: 3 stride-2 convolutions for 8-pixel patches, 4 for 16-pixel ones
        n_convs = sum(1 for k in state_dict
                      if k.startswith('trunk.patch_embed.proj.') and k.endswith('.0.weight'))
        return dict(embed_dim=state_dict['trunk.blocks.0.gamma1'].shape[0],
                    depth=count_blocks(state_dict), patch_size=2 ** n_convs)

    def describe_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> str:
        desc = super().describe_state_dict(state_dict)
        qkv = qkv_cfg_from_state_dict(state_dict, prefix='trunk.')
        # the Q/K/V embedding is named only where it differs from this model's
        if (desc.startswith(f'It looks like a checkpoint of {type(self).__name__}')
                and qkv is not None and normalize_qkv_cfg(qkv) != self.qkv_cfg):
            desc += f' with qkv_cfg={qkv} (set the backbone\'s qkv_cfg to match it)'
        return desc
