"""A backbone's arguments: checked into one frozen ``ColumnarArgs`` before anything is built
(``check_args``, the arch resolved against the family's table), what they fix read back as the
backbone's attributes (``arch``, ``out_indices``, ``pad_to``, ...), and the taps a backbone takes
by default (``default_taps``; the papers', ``even_taps``), which ``ColumnarBackbone``'s
``default_out_indices`` and ``feature_levels`` give a neck or head before it is built.
"""
import dataclasses
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from .arch_table import ArchSpec, ArchTable
from .checks import check_arguments, check_compile_blocks, check_out_indices
from .columnar_pyramid import PAPER_STRIDES, ColumnarPyramid

__all__ = ['ColumnarArgs', 'FeatureLevels', 'even_taps', 'paper_taps']


class FeatureLevels(NamedTuple):
    """What a backbone feeds its neck or heads, one entry per level.

    Attributes:
        channels (list[int]): Channels of each level (a neck's or head's ``in_channels``).
        strides (tuple[int]): Stride of each level.
        out_indices (tuple[int]): The 0-based trunk blocks tapped: one per level (the columnar
            pyramid), or the one every level is rescaled from (the simple pyramid).
    """
    channels: List[int]
    strides: Tuple[int, ...]
    out_indices: Tuple[int, ...]


def even_taps(depth: int) -> Tuple[int, ...]:
    """The papers' four taps of a ``depth``-block trunk, every family's default: the 0-based blocks
    at 1/3, 1/2, 2/3 and the end ((3, 5, 7, 11) for 12 blocks, (7, 11, 15, 23) for 24)."""
    return tuple(depth * num // den - 1 for num, den in ((1, 3), (1, 2), (2, 3), (1, 1)))


def paper_taps(name: str, taps: Sequence[int], out_strides: Sequence[int]) -> Tuple[int, ...]:
    """The paper's taps for ``out_strides``: all four for four levels, whatever their strides
    (the paper's adapter has four), else the tap of each stride.

    Args:
        name (str): The backbone, for messages (``XCiT(nano_12_p16)``).
        taps (Sequence[int]): The paper's four taps, for strides ``PAPER_STRIDES``.
        out_strides (Sequence[int]): Strides asked for: four, or fewer, increasing, out of
            ``PAPER_STRIDES``.

    Returns:
        tuple[int]: One 0-based block per stride, e.g. ``(5, 7, 11)`` for ``(8, 16, 32)`` of a
        12-block XCiT.
    """
    strides = tuple(out_strides)
    if len(strides) == len(taps):
        return tuple(taps)
    if not strides or any(s not in PAPER_STRIDES for s in strides) or \
            any(a >= b for a, b in zip(strides, strides[1:])):
        raise ValueError(
            f'{name}: out_strides={strides} has no default out_indices: the paper taps one block '
            f'per stride of {PAPER_STRIDES} ({tuple(taps)}), so increasing strides out of those take '
            'their taps by default (e.g. out_strides=(8, 16, 32)); for others give out_indices, '
            'one strictly increasing 0-based block per stride.')
    return tuple(taps[PAPER_STRIDES.index(s)] for s in strides)


@dataclasses.dataclass(frozen=True)
class ColumnarArgs:
    """A backbone's arguments, checked, and what they fix (``ColumnarBackbone.parse_args``): the
    trunk, the taps and the pyramid are built from it, and the backbone's attributes (``arch``,
    ``out_indices``, ``pad_to``, ...) read it. ``family`` holds the family's own arguments,
    checked by the family's ``parse_args``: a frozen dataclass of the family's (XCiT's
    ``XCiTArgs``, ViT's ``windows.WindowArgs``, CaiT's ``CaiTArgs``), None for a family without
    any."""
    arch: str  # a key of the family's arch_zoo
    spec: ArchSpec
    out_indices: Tuple[int, ...]
    out_strides: Tuple[int, ...]
    pyramid: str
    drop_path_rate: float
    layer_scale: Optional[float]
    norm_cfg: Mapping[str, Any]
    frozen_stages: int
    norm_eval: bool
    with_cp: bool
    pad_input: bool
    trunk_kwargs: Dict[str, Any]
    compile_blocks: Optional[Dict[str, Any]] = None
    family: Any = None

    @property
    def tap_stride(self) -> int:
        """The stride of the taps the adapter rescales: the patch size, or for a patch size that
        is not a power of two (14) the next one, the taps resampled to it."""
        return self.spec.tap_stride

    @property
    def pad_to(self) -> int:
        """What ``pad_input`` pads an input's sides to a multiple of."""
        return max(max(self.out_strides), self.tap_stride)

    @property
    def kept_blocks(self) -> int:
        """The blocks the trunk keeps: those up to the last tap."""
        return max(self.out_indices) + 1

    def with_family(self, family: Any) -> 'ColumnarArgs':
        """These arguments with the family's own, a dataclass instance (docs/backbones.md)."""
        if not dataclasses.is_dataclass(family) or isinstance(family, type):
            raise TypeError(f'with_family takes an instance of the family\'s own dataclass of its '
                            f'arguments, got {type(family).__name__}')
        return dataclasses.replace(self, family=family)


def pretrained_init_cfg(name: str, pretrained: Optional[str],
                         init_cfg: Optional[dict]) -> Optional[dict]:
    """``init_cfg`` with mmseg's older ``pretrained`` spelling of it taken in."""
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str) or pretrained.startswith(
            ('open-mmlab://', 'torchvision://', 'mmcls://')):
        raise ValueError(
            f'{name} got pretrained={pretrained!r}, the weights an mmseg base config sets for its '
            'ResNet (model.pretrained). Set model.pretrained=None and give ImageNet weights with '
            "backbone.init_cfg=dict(type='Pretrained', checkpoint=PATH).")
    if init_cfg is not None:
        raise ValueError(f'{name}: give either pretrained or init_cfg, not both.')
    return dict(type='Pretrained', checkpoint=pretrained)


def check_pyramid(name: str, pyramid: str) -> str:
    """``pyramid``, if it is one the backbones build."""
    if pyramid not in ('columnar', 'simple'):
        raise ValueError(f"{name}: pyramid={pyramid!r} must be 'columnar' (one "
                         "tap per level, the XCiT paper's) or 'simple' (ViTDet's: every level "
                         'from one tap, the last block by default).')
    return pyramid


def default_taps(name: str, spec: ArchSpec, out_strides: Sequence[int] = PAPER_STRIDES,
                 pyramid: str = 'columnar') -> Tuple[int, ...]:
    """The taps a backbone of arch ``spec`` and ``pyramid`` takes by default: the columnar
    pyramid's are the paper's taps of ``out_strides`` (``paper_taps``); the simple pyramid's, the
    last block. ``name`` names the backbone and arch in messages (``XCiT(nano_12_p16)``)."""
    if check_pyramid(name, pyramid) == 'simple':
        return (spec.depth - 1,)
    return paper_taps(name, spec.out_indices, out_strides)


def check_args(name: str, table: ArchTable, arch: str,
               out_indices: Optional[Sequence[int]] = None,
               out_strides: Sequence[int] = (4, 8, 16, 32),
               drop_path_rate: Optional[float] = None, norm_cfg: Optional[dict] = None,
               frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
               pad_input: bool = True, pyramid: str = 'columnar',
               layer_scale_init: Optional[float] = None,
               compile_blocks: Union[bool, Mapping[str, Any]] = False,
               **trunk_kwargs) -> ColumnarArgs:
    """A backbone's arguments (``ColumnarBackbone``'s, ``init_cfg`` and ``pretrained`` aside)
    checked, with what they fix, building nothing. ``name`` is the backbone's class name,
    ``table`` its family's arch table. Raises ``TypeError``/``ValueError`` saying what to pass."""
    check_arguments(name, drop_path_rate, norm_cfg, frozen_stages)
    key = table.resolve(arch, name)
    fixed = sorted(set(trunk_kwargs) & {'patch_size', 'embed_dim', 'depth', 'num_heads'})
    if fixed:
        raise ValueError(f'{name}: {", ".join(fixed)} is fixed by arch={arch!r}; choose '
                         f'another arch instead (valid: {", ".join(table)}).')
    spec, label = table[key], f'{name}({key})'
    pyramid = check_pyramid(name, pyramid)
    if out_indices is None:
        out_indices = default_taps(label, spec, out_strides, pyramid)
    out_indices = check_out_indices(
        name, key, out_indices, spec.depth, default_taps(label, spec, PAPER_STRIDES, pyramid),
        out_strides if pyramid == 'columnar' else out_strides[-1:])
    args = ColumnarArgs(
        arch=key, spec=spec, out_indices=out_indices, out_strides=tuple(out_strides),
        pyramid=pyramid, pad_input=pad_input,
        drop_path_rate=spec.drop_path_rate if drop_path_rate is None else drop_path_rate,
        layer_scale=spec.eta if layer_scale_init is None else layer_scale_init,
        norm_cfg=norm_cfg or dict(type='BN', requires_grad=True),
        frozen_stages=frozen_stages, norm_eval=norm_eval, with_cp=with_cp,
        trunk_kwargs=dict(trunk_kwargs),
        compile_blocks=check_compile_blocks(name, compile_blocks))
    _check_layout(name, args)
    return args


def _check_layout(name: str, args: ColumnarArgs) -> None:
    """Refuse strides the taps cannot be rescaled to, and ``frozen_stages`` past the blocks
    used (before the seconds a large trunk takes to build)."""
    if args.pad_to % args.tap_stride:
        raise ValueError(f'{name}: the largest output stride {args.pad_to} must be '
                         f'a multiple of the taps\' stride {args.tap_stride}.')
    if not -1 <= args.frozen_stages <= args.kept_blocks:
        raise ValueError(f'{name}: frozen_stages={args.frozen_stages} must be -1 '
                         '(nothing frozen), 0 (patch embedding) or k in [1, '
                         f'{args.kept_blocks}] (also the first k of the {args.kept_blocks} '
                         'blocks used).')
    ColumnarPyramid.check_strides(args.tap_stride, args.out_strides)
