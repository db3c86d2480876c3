"""What every columnar backbone shares: timm trunk -> taps -> ``ColumnarPyramid`` (``self.adapter``).

A family (XCiT, CaiT, TimmViT, TimmEVA, TimmBEiT) subclasses ``ColumnarBackbone`` and provides only
what its paper makes different: the architecture table, how to build the timm trunk, how to take the
taps, and how to convert its official checkpoints' keys. Padding, input checks, freezing,
``norm_eval``, ``with_cp`` and weight loading live here once.
"""
import dataclasses
import difflib
import re
import warnings
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule

from ...compat.torch import autocast_enabled
from ...tracing import in_graph_capture
from ..layers import BatchNormBase
from .arch_table import ArchSpec
from .checks import (
    blocks_compile_problem,
    check_arguments,
    check_compile_blocks,
    check_finite,
    check_input,
    check_out_indices,
    free_memory,
    inductor_cache_problem,
)
from .columnar_pyramid import PAPER_STRIDES, ColumnarPyramid
from .grad_checkpointing import enable_grad_checkpointing, full_recomputation
from .timm_releases import drop_pruned_classifier_parameters
from .weights import ColumnarWeights

__all__ = ['ColumnarBackbone', 'ColumnarArgs', 'ArchSpec', 'FeatureLevels', 'even_taps', 'paper_taps']


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

    def with_family(self, family: Any = None, **kwargs: Any) -> 'ColumnarArgs':
        """These arguments with the family's own: its dataclass (``family``), or keywords, kept
        as a dict (a family of one's own may keep its few arguments so, docs/backbones.md)."""
        if kwargs:
            if family is not None:
                raise TypeError('with_family takes the family\'s dataclass or keywords, not both')
            family = {**(self.family or {}), **kwargs}
        return dataclasses.replace(self, family=family)


def _pretrained_init_cfg(name: str, pretrained: Optional[str],
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


class ColumnarBackbone(ColumnarWeights, BaseModule):
    """Base class of columnar (single-stride) transformer backbones for mmdet and mmseg.

    The constructor checks its arguments first (``parse_args``: one frozen ``ColumnarArgs``,
    ``self.args``, that the attributes ``arch``, ``out_indices``, ``pad_to``... read), then builds
    the trunk, prunes it after the last tap, builds the pyramid and freezes what is asked.
    Families define ``arch_zoo`` (short name -> ``ArchSpec``), ``name_pattern`` (a regex that
    turns a timm model name into a short name), ``classifier_parts``, ``checkpoint_filter``,
    ``_build_trunk(args)`` and ``_forward_taps``; a family with arguments of its own checks them
    in its ``parse_args`` (``args.with_family(...)``), one with a faster forward sets
    ``fast_path_name`` (with its property) and ``_apply_fast_path``. docs/backbones.md has an
    example.

    With ``pad_input=False`` the input goes in unpadded, as in the official XCiT detection and
    segmentation code (its ADE20k evaluation ran on unpadded images): the conv stem rounds each
    stride-2 step up and the max-pool levels round down, so level sizes are only close to ``H/s``
    (mmseg's heads resize). Both settings give the same result on sizes divisible by the largest
    stride.

    Args:
        arch (str): Short architecture name or timm's full model name.
        out_indices (Sequence[int], optional): 0-based blocks to tap, one per output stride;
            default: the paper's taps of the strides asked for (``default_out_indices``).
        out_strides (Sequence[int]): Strides of the pyramid levels; ``(8, 16, 32)`` feeds a
            3-level neck or head. Default: (4, 8, 16, 32).
        drop_path_rate (float, optional): Stochastic depth; default: the paper's for ``arch``.
        norm_cfg (dict): Norm layers of the conv parts (trunk BatchNorms, ``ColumnarPyramid``).
            Default: ``dict(type='BN', requires_grad=True)``; use ``SyncBN`` for multi-GPU.
        frozen_stages (int): -1: nothing frozen; 0: patch embedding (and position encoding);
            k > 0: also the first k blocks. Frozen parts get no gradients and their BatchNorms
            stay in eval mode. Default: -1.
        norm_eval (bool): Keep every BatchNorm of the backbone in eval mode while training.
            Default: False.
        with_cp (bool): Gradient checkpointing of every block (timm's own, which recomputes
            each block in the backward pass; BatchNorm statistics are updated once per step, not
            again by the recomputation). Default: False.
        compile_blocks (bool | dict): Compile every block's attention and MLP in place with
            ``torch.compile`` (``nn.Module.compile``: the state dict keeps its keys, so
            checkpoints load and resume as without it), with dynamic sizes: every block's copy of
            a part is one graph for every input size (a recipe's multi-scale training compiles
            each part once). A dict gives ``torch.compile``'s options (``mode``, ``backend``,
            ``options``; ``dynamic`` defaults to True). What runs around those parts (norms,
            residuals, stochastic depth, a family's own layers) stays eager. Needs a torch whose
            dynamo inlines modules (``checks.blocks_compile_problem``: torch 2.13, not 2.1).
            Warns where ``ATEN_CPU_CAPABILITY`` is set and inductor's cache is shared
            (``checks.inductor_cache_problem``).
            docs/training.md#compiling-the-backbone has what it gains. Default: False.
        pad_input (bool): Zero-pad the input at the bottom/right to a multiple of the largest
            output stride, so that every level is exactly ``H/s``. Default: True.
        pyramid (str): ``'columnar'``: the XCiT paper's adapter, one tap per level (appendix
            B.2); ``'simple'``: ViTDet's simple feature pyramid, every level rescaled from one
            tap (default: the last block; Li et al., ECCV 2022). Default: ``'columnar'``.
        layer_scale_init (float, optional): LayerScale init of every block; default: the
            paper's for ``arch``.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads a
            classification, timm, detector or segmentor checkpoint and logs a report;
            ``checkpoint_key='student'`` takes a DINO checkpoint's student.
        pretrained (str, optional): mmseg's older spelling of ``init_cfg``'s checkpoint (its
            segmentors pass ``model.pretrained`` down). Default: None.
        trunk_kwargs: Passed to the timm model (e.g. ``attn_drop_rate``).
    """
    arch_zoo: ClassVar[Mapping[str, ArchSpec]] = {}
    name_pattern: ClassVar[str] = ''
    #: the timm trunk's classification parts, which a dense backbone never builds: checkpoint
    #: tensors under them are dropped on purpose
    classifier_parts: ClassVar[Tuple[str, ...]] = ()
    #: timm's ``checkpoint_filter_fn(state_dict, model)`` of the family (official key layouts)
    checkpoint_filter: ClassVar[Optional[Callable]] = None
    #: the family's argument (and attribute) that switches its faster forward, ``'auto'``, True or
    #: False (XCiT: ``gram_xca``, CaiT: ``query_chunks``); set after ``__init__`` by the family
    fast_path_name: ClassVar[str] = ''
    #: the timm class of the trunk's blocks: one unit each of sharded training (FSDP,
    #: ``deepvit_mm.engine.distributed.fsdp.columnar_block_policy``)
    block_type: ClassVar[Optional[Type[nn.Module]]] = None
    families: ClassVar[List[Type['ColumnarBackbone']]] = []
    #: the fast path's setting (a family sets it after building, through its property)
    _fast_path: Union[bool, str] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.arch_zoo is not ColumnarBackbone.arch_zoo:  # a table: a family (nothing read)
            ColumnarBackbone.families.append(cls)

    def __init__(self, arch: str, *, init_cfg: Optional[dict] = None,
                 pretrained: Optional[str] = None, **kwargs) -> None:
        super().__init__(init_cfg=_pretrained_init_cfg(type(self).__name__, pretrained, init_cfg))
        self.args = args = self.parse_args(arch, **kwargs)
        # what forward checked that reads the device (checks.py): the values of its first input,
        # and per device the largest need of memory found free
        self._values_checked = False
        self._memory_checked: Dict[str, int] = {}
        self.trunk = self._build_trunk(args)
        self.trunk.prune_intermediate_layers(args.out_indices, prune_norm=True, prune_head=True)
        drop_pruned_classifier_parameters(self.trunk, self.classifier_parts)
        self.adapter = self._build_adapter(args)
        if args.with_cp:
            enable_grad_checkpointing(self.trunk)
        self._freeze_stages()
        if args.compile_blocks is not None:
            self._compile_blocks(args.compile_blocks)

    @classmethod
    def parse_args(cls, arch: str, out_indices: Optional[Sequence[int]] = None,
                   out_strides: Sequence[int] = (4, 8, 16, 32),
                   drop_path_rate: Optional[float] = None, norm_cfg: Optional[dict] = None,
                   frozen_stages: int = -1, norm_eval: bool = False, with_cp: bool = False,
                   pad_input: bool = True, pyramid: str = 'columnar',
                   layer_scale_init: Optional[float] = None,
                   compile_blocks: Union[bool, Mapping[str, Any]] = False,
                   **trunk_kwargs) -> ColumnarArgs:
        """The constructor's arguments (the class docstring's, ``init_cfg`` and ``pretrained``
        aside) checked, with what they fix, building nothing; a family adds its own arguments.
        Raises ``TypeError``/``ValueError`` saying what to pass."""
        name = cls.__name__
        check_arguments(name, drop_path_rate, norm_cfg, frozen_stages)
        key = cls.resolve_arch(arch)
        fixed = sorted(set(trunk_kwargs) & {'patch_size', 'embed_dim', 'depth', 'num_heads'})
        if fixed:
            raise ValueError(f'{name}: {", ".join(fixed)} is fixed by arch={arch!r}; choose '
                             f'another arch instead (valid: {", ".join(cls.arch_zoo)}).')
        spec = cls.arch_zoo[key]
        pyramid = cls._check_pyramid(pyramid)
        if out_indices is None:
            out_indices = cls.default_out_indices(key, out_strides, pyramid)
        out_indices = check_out_indices(
            name, key, out_indices, spec.depth, cls.default_out_indices(key, PAPER_STRIDES, pyramid),
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
        cls._check_layout(args)
        return args

    @classmethod
    def _check_layout(cls, args: ColumnarArgs) -> None:
        """Refuse strides the taps cannot be rescaled to, and ``frozen_stages`` past the blocks
        used (before the seconds a large trunk takes to build)."""
        if args.pad_to % args.tap_stride:
            raise ValueError(f'{cls.__name__}: the largest output stride {args.pad_to} must be '
                             f'a multiple of the taps\' stride {args.tap_stride}.')
        if not -1 <= args.frozen_stages <= args.kept_blocks:
            raise ValueError(f'{cls.__name__}: frozen_stages={args.frozen_stages} must be -1 '
                             '(nothing frozen), 0 (patch embedding) or k in [1, '
                             f'{args.kept_blocks}] (also the first k of the {args.kept_blocks} '
                             'blocks used).')
        ColumnarPyramid.check_strides(args.tap_stride, args.out_strides)

    def _build_adapter(self, args: ColumnarArgs) -> ColumnarPyramid:
        """The trunk's BatchNorms converted to ``norm_cfg``, and the pyramid."""
        try:  # what is left to fail is building the norm layers from norm_cfg
            self._convert_batchnorms(self.trunk, args.norm_cfg)
            return ColumnarPyramid(args.spec.embed_dim, in_stride=args.tap_stride,
                                   out_strides=args.out_strides, norm_cfg=args.norm_cfg)
        except (AssertionError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f'{type(self).__name__}: cannot build norm layers from norm_cfg='
                             f'{args.norm_cfg} ({type(e).__name__}: {e}). Use e.g. '
                             "dict(type='BN'), dict(type='SyncBN') or dict(type='GN', "
                             'num_groups=G) with G dividing every channel count.') from e

    # what the arguments fixed (``self.args``): plain properties, which torch 2.1's dynamo guards
    # (a property made by a function would hold its name in a closure, which 2.1 cannot guard)
    @property
    def arch(self) -> str:
        """The arch: a key of ``arch_zoo``."""
        return self.args.arch

    @property
    def out_indices(self) -> Tuple[int, ...]:
        """The 0-based blocks tapped."""
        return self.args.out_indices

    @property
    def out_strides(self) -> Tuple[int, ...]:
        """The strides of the pyramid levels."""
        return self.args.out_strides

    @property
    def pyramid(self) -> str:
        """``'columnar'`` or ``'simple'``."""
        return self.args.pyramid

    @property
    def norm_cfg(self) -> Mapping:
        """The norm layers of the conv parts."""
        return self.args.norm_cfg

    @property
    def frozen_stages(self) -> int:
        """See the class docstring."""
        return self.args.frozen_stages

    @property
    def norm_eval(self) -> bool:
        """See the class docstring."""
        return self.args.norm_eval

    @property
    def with_cp(self) -> bool:
        """See the class docstring."""
        return self.args.with_cp

    @property
    def tap_stride(self) -> int:
        """The stride of the taps (``ColumnarArgs.tap_stride``)."""
        return self.args.tap_stride

    @property
    def pad_to(self) -> int:
        """What ``pad_input`` pads an input's sides to a multiple of."""
        return self.args.pad_to

    @property
    def _kept_blocks(self) -> int:
        """The blocks the trunk keeps: those up to the last tap."""
        return self.args.kept_blocks

    @property
    def pad_input(self) -> bool:
        """See the class docstring; may be switched on a built backbone (it changes no weight)."""
        return self.args.pad_input

    @pad_input.setter
    def pad_input(self, value: bool) -> None:
        self.args = dataclasses.replace(self.args, pad_input=bool(value))

    @property
    def depth(self) -> int:
        """The arch's depth (the trunk keeps ``_kept_blocks`` of them)."""
        return self.args.spec.depth

    @property
    def patch_size(self) -> int:
        return self.args.spec.patch_size

    @property
    def embed_dim(self) -> int:
        return self.args.spec.embed_dim

    @property
    def in_chans(self) -> int:
        return self.args.trunk_kwargs.get('in_chans', 3)

    @property
    def out_channels(self) -> List[int]:
        """Channels of each level (a neck's ``in_channels``)."""
        return [self.embed_dim] * len(self.out_strides)

    # ----------------------------------------------------------------- architecture table
    @classmethod
    def resolve_arch(cls, arch: str) -> str:
        """Map a short name (``small_12_p8``) or timm name (``xcit_small_12_p8_224``) to a key of
        ``arch_zoo``; anything else raises with the valid names and the closest one."""
        if not isinstance(arch, str):
            raise TypeError(f'{cls.__name__}: arch must be a string, got {type(arch).__name__}')
        name = arch.strip().lower().split('.')[0]  # drop a timm pretrained tag (".fb_in1k")
        if name not in cls.arch_zoo:
            m = re.fullmatch(cls.name_pattern, name)
            name = m.group(1) if m else name
        if name not in cls.arch_zoo:
            close = difflib.get_close_matches(name, list(cls.arch_zoo), n=1)
            raise ValueError(
                f'{cls.__name__}: unknown arch {arch!r}.'
                + (f' Did you mean {close[0]!r}?' if close else '')
                + f' Valid: {cls._valid_archs()}.')
        return name

    @classmethod
    def _valid_archs(cls) -> str:
        """The valid arch names, for an error message."""
        return (f'{", ".join(cls.arch_zoo)} (or timm names such as '
                f'{next(iter(cls.arch_zoo.values())).timm!r})')

    # ----------------------------------------------------------------- what a neck or head reads
    @classmethod
    def _check_pyramid(cls, pyramid: str) -> str:
        if pyramid not in ('columnar', 'simple'):
            raise ValueError(f"{cls.__name__}: pyramid={pyramid!r} must be 'columnar' (one "
                             "tap per level, the XCiT paper's) or 'simple' (ViTDet's: every level "
                             'from one tap, the last block by default).')
        return pyramid

    @classmethod
    def default_out_indices(cls, arch: str, out_strides: Sequence[int] = (4, 8, 16, 32),
                            pyramid: str = 'columnar') -> Tuple[int, ...]:
        """The taps a backbone of ``pyramid`` takes by default: the columnar pyramid's are the
        paper's taps of ``out_strides`` (increasing, out of 4/8/16/32), e.g.
        ``XCiT.default_out_indices('small_12_p16', (8, 16, 32)) == (5, 7, 11)``; the simple
        pyramid's, the last block (``(11,)``)."""
        arch = cls.resolve_arch(arch)
        if cls._check_pyramid(pyramid) == 'simple':
            return (cls.arch_zoo[arch].depth - 1,)
        return paper_taps(f'{cls.__name__}({arch})', cls.arch_zoo[arch].out_indices, out_strides)

    @classmethod
    def feature_levels(cls, arch: str, out_strides: Sequence[int] = (4, 8, 16, 32),
                       out_indices: Optional[Sequence[int]] = None,
                       pyramid: str = 'columnar') -> FeatureLevels:
        """What the backbone built with these arguments feeds a neck or head, per level:
        ``channels`` (a neck's ``in_channels``), ``strides``, and the blocks it taps
        (``out_indices``: one per level, or the simple pyramid's one); e.g.
        ``XCiT.feature_levels('small_12_p8').channels == [384, 384, 384, 384]``."""
        arch = cls.resolve_arch(arch)
        taps = cls.default_out_indices(arch, out_strides, pyramid) if out_indices is None \
            else tuple(out_indices)
        return FeatureLevels(channels=[cls.arch_zoo[arch].embed_dim] * len(out_strides),
                             strides=tuple(out_strides), out_indices=taps)

    @staticmethod
    def _convert_batchnorms(module: nn.Module, norm_cfg: dict) -> None:
        """timm hard-codes ``nn.BatchNorm2d`` in conv parts; rebuild them from ``norm_cfg``
        (same parameter names, so checkpoints load unchanged)."""
        if norm_cfg.get('type') == 'BN' and norm_cfg.get('requires_grad', True):
            return
        for name, child in list(module.named_children()):
            if type(child) is nn.BatchNorm2d:
                new = build_norm_layer(norm_cfg, child.num_features)[1]
                new.load_state_dict(child.state_dict(), strict=False)
                setattr(module, name, new)
            else:
                ColumnarBackbone._convert_batchnorms(child, norm_cfg)

    # ----------------------------------------------------------------- to implement
    def _build_trunk(self, args: ColumnarArgs) -> nn.Module:
        """The timm model of ``args`` (its ``spec``, ``drop_path_rate``, ``layer_scale``,
        ``trunk_kwargs`` and the family's own arguments)."""
        raise NotImplementedError

    def _forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Raw outputs of blocks ``out_indices`` as NCHW maps at stride ``patch_size``."""
        raise NotImplementedError

    def convert_trunk_keys(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Official/timm classification keys -> timm model keys (without ``trunk.``), with the
        family's timm ``checkpoint_filter``."""
        if self.checkpoint_filter is None:
            return dict(state_dict)
        return self.checkpoint_filter(dict(state_dict), self.trunk)

    @classmethod
    def state_dict_traits(cls, state_dict: Mapping[str, torch.Tensor]) -> Optional[Dict[str, int]]:
        """The ``ArchSpec`` fields that tell this family's archs apart (``embed_dim``, ``depth``,
        ...), as a converted state dict (trunk keys) shows them; None if it is not this family's."""
        return None

    @classmethod
    def _named_archs(cls) -> Iterable[str]:
        """The archs ``arch_from_state_dict`` looks among: every arch of ``arch_zoo``."""
        return cls.arch_zoo

    @classmethod
    def arch_from_state_dict(cls, state_dict: Mapping[str, torch.Tensor]) -> Optional[str]:
        """The arch a converted state dict was trained as: the first of ``_named_archs`` with its
        ``state_dict_traits``; None if it is not this family's or no arch has them."""
        return cls.arch_with_traits(cls.state_dict_traits(state_dict))

    @classmethod
    def arch_with_traits(cls, traits: Optional[Dict[str, int]]) -> Optional[str]:
        """The first of ``_named_archs`` whose spec has ``traits``; None if none has them."""
        if traits is None:
            return None
        return next((name for name in cls._named_archs()
                     if all(getattr(cls.arch_zoo[name], k) == v for k, v in traits.items())), None)

    def _apply_fast_path(self, mode: Union[bool, str]) -> None:
        """Make the trunk run as the family's switch (``fast_path_name``) says."""
        raise NotImplementedError

    def _stem_modules(self) -> List[nn.Module]:
        """What ``frozen_stages=0`` freezes: the patch embedding (families add their position
        encoding, as a module here or as a parameter in ``_stem_parameters``)."""
        return [self.trunk.patch_embed]

    def _stem_parameters(self) -> List[nn.Parameter]:
        """Parameters outside any module of ``_stem_modules`` that ``frozen_stages=0`` freezes."""
        return []

    # ----------------------------------------------------------------- faster forward
    def _get_fast_path(self) -> Union[bool, str]:
        return self._fast_path

    def _set_fast_path(self, mode: Union[bool, str]) -> None:
        """Validate and apply the family's switch; the family exposes it as a property named
        ``fast_path_name`` (``gram_xca = property(_get_fast_path, _set_fast_path)``)."""
        if mode not in (True, False, 'auto'):
            raise ValueError(f"{type(self).__name__}: {self.fast_path_name} must be 'auto', True "
                             f'or False, got {mode!r}')
        self._fast_path = mode if mode == 'auto' else bool(mode)
        self._apply_fast_path(self._fast_path)

    # ----------------------------------------------------------------- compiled blocks
    def _compiled_modules(self) -> List[nn.Module]:
        """What ``compile_blocks`` compiles: every block's attention and MLP (timm's ``attn`` and
        ``mlp``), most of a block's arithmetic; a family leaves out a part inductor cannot take."""
        return [m for blk in self.trunk.blocks for m in (getattr(blk, 'attn', None),
                                                         getattr(blk, 'mlp', None))
                if isinstance(m, nn.Module)]

    def _compile_blocks(self, options: Mapping[str, Any]) -> None:
        problem = blocks_compile_problem()
        if problem is not None:
            raise RuntimeError(f'{type(self).__name__}: compile_blocks: {problem}')
        problem = inductor_cache_problem()
        if problem is not None:
            warnings.warn(f'{type(self).__name__}: compile_blocks: {problem}', stacklevel=3)
        options = {'dynamic': True, **options}
        for m in self._compiled_modules():
            m.compile(**options)

    # ----------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Args:
            x (Tensor): ``(B, in_chans, H, W)`` float images, any ``H, W >= patch_size``.

        Returns:
            tuple[Tensor]: one ``(B, embed_dim, ceil(H/32)*32/s, ceil(W/32)*32/s)`` map per output
            stride ``s`` (the input is zero-padded at the bottom/right to a multiple of 32;
            with ``pad_input=False`` the maps are as large as the unpadded input gives). An empty
            batch gives empty maps.

        Nothing in it waits for the device: the input's values are checked (NaN) on the first
        call only, the free memory asked for an input larger than any before (checks.py).
        """
        check_input(self, x)
        if not self._values_checked and not in_graph_capture():
            check_finite(self, x)
            self._values_checked = True
        if x.shape[0] == 0:
            return self._empty_output(x)
        h, w = x.shape[-2:]
        if self.pad_input:
            H, W = self._padded_size(h, w)
            if (H, W) != (h, w):
                x = F.pad(x, (0, W - w, 0, H - h))
        if not in_graph_capture():
            self._check_memory(x)
        with full_recomputation(self.with_cp):
            taps = self._forward_taps(x)
        if self.pyramid == 'simple':  # every level from the one tap
            taps = taps * len(self.out_strides)
        return self.adapter(taps)

    def _padded_size(self, h: int, w: int) -> Tuple[int, int]:
        """The size ``pad_input`` pads an ``h x w`` input to: the next multiple of the largest
        stride (a family with a fixed input size refuses a larger one here)."""
        return -(-h // self.pad_to) * self.pad_to, -(-w // self.pad_to) * self.pad_to

    def _empty_output(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if self.pad_input:
            H, W = self._padded_size(*x.shape[-2:])
            return tuple(x.new_zeros(0, self.embed_dim, H // s, W // s) for s in self.out_strides)
        with torch.no_grad():  # unpadded sizes round per layer: take them from one image
            return tuple(o[:0] for o in self.forward(x.new_zeros(1, *x.shape[1:])))

    # ----------------------------------------------------------------- memory
    def _activation_bytes(self, batch: int, grid: Tuple[int, int], element: int,
                          device: torch.device) -> int:
        """A lower bound of the memory one forward needs beyond the weights: the family adds its
        attention (CaiT's is quadratic in tokens). Here: four token maps of the widest block
        (input, norm, and the MLP's 4x hidden) live at once; training keeps each block's."""
        tokens = batch * grid[0] * grid[1]
        per_block = tokens * self.embed_dim * element * 6
        if torch.is_grad_enabled() and self.training and not self.with_cp:
            return per_block * self._kept_blocks
        return per_block

    def _memory_remedy(self) -> str:
        return 'use smaller inputs, or with_cp=True for training'

    def _check_memory(self, x: torch.Tensor) -> None:
        """Refuse, before allocating, an input whose forward cannot fit the device's free memory.
        Asks the device only for a need larger than any found to fit before (on a GPU the
        question waits for the queued kernels)."""
        grid = (-(-x.shape[-2] // self.patch_size), -(-x.shape[-1] // self.patch_size))
        element = 2 if autocast_enabled(x.device.type) else x.element_size()
        need = self._activation_bytes(x.shape[0], grid, element, x.device)
        if need <= self._memory_checked.get(str(x.device), -1):
            return
        free = free_memory(x.device)
        if free is None or need <= free:
            self._memory_checked[str(x.device)] = need
        else:
            raise MemoryError(
                f'{type(self).__name__}({self.arch}): input {tuple(x.shape)} ({grid[0]}x{grid[1]} '
                f'patches) needs at least {need / 2**30:.1f} GiB for its activations, more than '
                f'the {free / 2**30:.1f} GiB free on {x.device}: {self._memory_remedy()}.')

    # ----------------------------------------------------------------- training controls
    def _frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        return self._stem_modules() + list(self.trunk.blocks[:self.frozen_stages])

    def _freeze_stages(self) -> None:
        for m in self._frozen_modules():
            m.eval()
            for p in m.parameters():
                p.requires_grad = False
        for p in self._stem_parameters() if self.frozen_stages >= 0 else []:
            p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, BatchNormBase):
                    m.eval()
        return self


def count_blocks(state_dict: Mapping[str, torch.Tensor], prefix: str = 'trunk.blocks.') -> int:
    """Number of blocks ``prefix{i}.*`` in a state dict."""
    ids = {int(m.group(1)) for k in state_dict for m in [re.match(re.escape(prefix) + r'(\d+)\.', k)]
           if m}
    return max(ids) + 1 if ids else 0

