"""What every columnar backbone shares: timm trunk -> taps -> ``ColumnarPyramid`` (``self.adapter``).

A family (XCiT, CaiT, TimmViT, TimmEVA, TimmBEiT) subclasses ``ColumnarBackbone`` and provides only
what its paper makes different: the architecture table, how to build the timm trunk, how to take the
taps, and how to convert its official checkpoints' keys. Building, padding, input checks, the
forward, freezing (``frozen_stages``, ``norm_eval``, ``with_cp``), the family hooks and the
loader's side of a checkpoint are here; what it calls is beside it: the arguments checked
(``arguments.check_args``), the arch table (``arch_table.ArchTable``), the memory guard
(``memory.check_memory``), which family a checkpoint is (``families``) and its key layouts
(``weights``).
"""
import warnings
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule

from ...checkpoints import LoadReport, load_weights, read_checkpoint
from ...tracing import in_graph_capture
from ..layers import BatchNormBase
from .arch_table import ArchTable
from .arguments import ColumnarArgs, FeatureLevels, check_args, default_taps, pretrained_init_cfg
from .checks import blocks_compile_problem, check_finite, check_input, inductor_cache_problem
from .columnar_pyramid import ColumnarPyramid
from .families import describe_state_dict
from .grad_checkpointing import enable_grad_checkpointing, full_recomputation
from .memory import check_memory
from .timm_releases import drop_pruned_classifier_parameters
from .weights import backbone_keys, unbuilt_key_patterns

__all__ = ['ColumnarBackbone']


class ColumnarBackbone(BaseModule):
    """Base class of columnar (single-stride) transformer backbones for mmdet and mmseg.

    The constructor checks its arguments first (``parse_args``: one frozen ``ColumnarArgs``,
    ``self.args``, whose values it sets as attributes: ``arch``, ``out_indices``, ``pad_to``...), then builds
    the trunk, prunes it after the last tap, builds the pyramid and freezes what is asked.
    Families define ``arch_zoo`` (an ``ArchTable``: short name -> ``ArchSpec``, and the timm names
    it takes), ``classifier_parts``, ``checkpoint_filter``, ``_build_trunk(args)`` and
    ``_forward_taps``; a family with arguments of its own checks them in its ``parse_args``
    (``args.with_family(...)``), one with a faster forward sets
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
            dynamo inlines modules (``checks.blocks_compile_problem``: not torch 2.1).
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
    #: the family's archs (a family sets its own: it is then one of ``families``)
    arch_zoo: ClassVar[ArchTable] = ArchTable(dict, dict)
    #: every family (a subclass with an arch table of its own), in the order they were defined
    families: ClassVar[List[Type['ColumnarBackbone']]] = []
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
    #: the fast path's setting (a family sets it after building, through its property)
    _fast_path: Union[bool, str] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.arch_zoo is not ColumnarBackbone.arch_zoo:  # a table: a family (nothing read)
            cls.families.append(cls)

    def __init__(self, arch: str, *, init_cfg: Optional[dict] = None,
                 pretrained: Optional[str] = None, **kwargs) -> None:
        super().__init__(init_cfg=pretrained_init_cfg(type(self).__name__, pretrained, init_cfg))
        self.args = args = self.parse_args(arch, **kwargs)
        # what the arguments fix, as attributes (``pad_input`` may be switched on a built
        # backbone: it changes no weight)
        self.arch, self.out_indices, self.out_strides = args.arch, args.out_indices, args.out_strides
        self.pyramid, self.norm_cfg, self.pad_input = args.pyramid, args.norm_cfg, args.pad_input
        self.frozen_stages, self.norm_eval, self.with_cp = \
            args.frozen_stages, args.norm_eval, args.with_cp
        self.depth, self.patch_size, self.embed_dim = \
            args.spec.depth, args.spec.patch_size, args.spec.embed_dim
        self.in_chans = args.trunk_kwargs.get('in_chans', 3)
        self.tap_stride, self.pad_to, self.kept_blocks = args.tap_stride, args.pad_to, args.kept_blocks
        self.out_channels = [self.embed_dim] * len(self.out_strides)  # a neck's in_channels
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

    def _build_adapter(self, args: ColumnarArgs) -> ColumnarPyramid:
        """The trunk's BatchNorms converted to ``norm_cfg``, and the pyramid."""
        try:  # what is left to fail is building the norm layers from norm_cfg
            convert_batchnorms(self.trunk, args.norm_cfg)
            return ColumnarPyramid(args.spec.embed_dim, in_stride=args.tap_stride,
                                   out_strides=args.out_strides, norm_cfg=args.norm_cfg)
        except (AssertionError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f'{type(self).__name__}: cannot build norm layers from norm_cfg='
                             f'{args.norm_cfg} ({type(e).__name__}: {e}). Use e.g. '
                             "dict(type='BN'), dict(type='SyncBN') or dict(type='GN', "
                             'num_groups=G) with G dividing every channel count.') from e

    # ----------------------------------------------------------------- arguments, arch table
    @classmethod
    def parse_args(cls, arch: str, **kwargs) -> ColumnarArgs:
        """The constructor's arguments (the class docstring's, ``init_cfg`` and ``pretrained``
        aside) checked, with what they fix, building nothing (``arguments.check_args``). A family
        with arguments of its own takes them out here and adds them (``args.with_family``)."""
        return check_args(cls.__name__, cls.arch_zoo, arch, **kwargs)

    @classmethod
    def default_out_indices(cls, arch: str, out_strides: Sequence[int] = (4, 8, 16, 32),
                            pyramid: str = 'columnar') -> Tuple[int, ...]:
        """The taps a backbone of ``pyramid`` takes by default: the columnar pyramid's are the
        paper's taps of ``out_strides`` (increasing, out of 4/8/16/32), e.g.
        ``XCiT.default_out_indices('small_12_p16', (8, 16, 32)) == (5, 7, 11)``; the simple
        pyramid's, the last block (``(11,)``)."""
        arch = cls.arch_zoo.resolve(arch, cls.__name__)
        return default_taps(f'{cls.__name__}({arch})', cls.arch_zoo[arch], out_strides, pyramid)

    @classmethod
    def feature_levels(cls, arch: str, out_strides: Sequence[int] = (4, 8, 16, 32),
                       out_indices: Optional[Sequence[int]] = None,
                       pyramid: str = 'columnar') -> FeatureLevels:
        """What the backbone built with these arguments feeds a neck or head, per level:
        ``channels`` (a neck's ``in_channels``), ``strides``, and the blocks it taps
        (``out_indices``: one per level, or the simple pyramid's one); e.g.
        ``XCiT.feature_levels('small_12_p8').channels == [384, 384, 384, 384]``."""
        arch = cls.arch_zoo.resolve(arch, cls.__name__)
        taps = cls.default_out_indices(arch, out_strides, pyramid) if out_indices is None \
            else tuple(out_indices)
        return FeatureLevels(channels=[cls.arch_zoo[arch].embed_dim] * len(out_strides),
                             strides=tuple(out_strides), out_indices=taps)

    # ----------------------------------------------------------------- to implement
    def _build_trunk(self, args: ColumnarArgs) -> nn.Module:
        """The timm model of ``args`` (its ``spec``, ``drop_path_rate``, ``layer_scale``,
        ``trunk_kwargs`` and the family's own arguments)."""
        raise NotImplementedError

    def _forward_taps(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Raw outputs of blocks ``out_indices`` as NCHW maps at stride ``patch_size``."""
        raise NotImplementedError

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

    def _activation_bytes(self, batch: int, grid: Tuple[int, int], element: int,
                          device: torch.device) -> int:
        """A lower bound of the memory one forward needs beyond the weights (the memory guard,
        ``memory.check_memory``): the family adds its attention (CaiT's is quadratic in tokens).
        Here: four token maps of the widest block (input, norm, and the MLP's 4x hidden) live at
        once; training keeps each block's."""
        tokens = batch * grid[0] * grid[1]
        per_block = tokens * self.embed_dim * element * 6
        if torch.is_grad_enabled() and self.training and not self.with_cp:
            return per_block * self.kept_blocks
        return per_block

    def _memory_remedy(self) -> str:
        """What the memory guard's refusal tells the user to change."""
        return 'use smaller inputs, or with_cp=True for training'

    @classmethod
    def state_dict_traits(cls, state_dict: Mapping[str, torch.Tensor]) -> Optional[Dict[str, int]]:
        """The ``ArchSpec`` fields that tell this family's archs apart (``embed_dim``, ``depth``,
        ...), as a converted state dict (trunk keys) shows them; None if it is not this family's
        (``families.arch_from_state_dict``)."""
        return None

    # ----------------------------------------------------------------- checkpoints
    # the loader's side (``deepvit_mm.checkpoints.WeightsTarget``): the layouts converted, what is
    # dropped on purpose or may stay at init, the family's resizing, a description of a checkpoint
    # that does not fit; ``init_cfg`` / ``load_pretrained`` through the one loader
    def init_weights(self) -> None:
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            self.load_pretrained(cfg['checkpoint'], checkpoint_key=cfg.get('checkpoint_key'))
            self._is_init = True
        else:
            super().init_weights()

    def load_pretrained(self, path: str, checkpoint_key: Optional[str] = None) -> LoadReport:
        """Load ``path`` (a file, ``~/...`` or an ``http(s)://`` URL, in any supported format and
        layout) through ``deepvit_mm.checkpoints.load_weights``; log and return the report.

        Args:
            path (str): The checkpoint.
            checkpoint_key (str, optional): The part to take, e.g. ``'student'`` of a DINO
                training checkpoint (default: its ``teacher``).
        """
        return load_weights(self, read_checkpoint(path), source=repr(path),
                            checkpoint_key=checkpoint_key)

    def convert_state_dict(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Any supported layout -> this module's keys (``trunk.*``, ``adapter.*``;
        ``weights.backbone_keys``)."""
        return backbone_keys(state_dict, self.convert_trunk_keys)

    def convert_trunk_keys(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Official/timm classification keys -> timm model keys (without ``trunk.``), with the
        family's timm ``checkpoint_filter``."""
        if self.checkpoint_filter is None:
            return dict(state_dict)
        return self.checkpoint_filter(dict(state_dict), self.trunk)

    def dropped_key_patterns(self) -> List[str]:
        """Regexes of converted checkpoint keys dropped on purpose: the classifier and the blocks
        after the last tap."""
        return unbuilt_key_patterns(self.classifier_parts, self.kept_blocks, self.depth)

    def init_ok_key_patterns(self) -> List[str]:
        """Module keys that may stay at init when the checkpoint lacks them."""
        return [r'^adapter\.']

    def resize_weight(self, key: str, value: torch.Tensor,
                      target: torch.Tensor) -> Optional[torch.Tensor]:
        """``value`` resized to ``target``'s shape, or None when it cannot be (the family decides:
        CaiT resamples its position embedding)."""
        return None

    def describe_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> str:
        """What ``state_dict`` (trunk keys) looks like, for a refusal's message."""
        return describe_state_dict(self.families, state_dict)

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
            check_memory(self, x, self._memory_checked)
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


def convert_batchnorms(module: nn.Module, norm_cfg: dict) -> None:
    """timm hard-codes ``nn.BatchNorm2d`` in conv parts; rebuild them from ``norm_cfg`` (same
    parameter names, so checkpoints load unchanged)."""
    if norm_cfg.get('type') == 'BN' and norm_cfg.get('requires_grad', True):
        return
    for name, child in list(module.named_children()):
        if type(child) is nn.BatchNorm2d:
            new = build_norm_layer(norm_cfg, child.num_features)[1]
            new.load_state_dict(child.state_dict(), strict=False)
            setattr(module, name, new)
        else:
            convert_batchnorms(child, norm_cfg)
