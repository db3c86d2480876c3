"""Optimizer constructors for models with a columnar backbone (XCiT, CaiT, timm's ViT family):
layer-wise learning-rate decay, and the opt-in weight-decay exemption of the scales.

Layer-wise decay (ELECTRA, Clark et al., ICLR 2020; BEiT, Bao et al., ICLR 2022; since then the
usual way to fine-tune a pretrained ViT for detection and segmentation) gives each parameter the
learning rate ``lr * decay_rate ** (L + 1 - layer_id)`` for an ``L``-block trunk: the embedding
is layer 0, block ``i`` (0-based) layer ``i + 1``, and everything after the trunk
(``ColumnarPyramid``, neck, heads) layer ``L + 1`` with the full learning rate. mmseg's and mmdet's
``LearningRateDecayOptimizerConstructor`` do the same for BEiT/MAE/ConvNeXt from the parameter
names of those backbones; this one subclasses the same mmengine ``DefaultOptimWrapperConstructor``
and takes the layers from the model's structure (``trunk.blocks`` of the ``ColumnarBackbone`` it
contains). It has its own name because mmseg already registers a ``LayerDecayOptimizerConstructor``
(BEiT's, deprecated).

Weight decay is 0 for what the model says should not decay, found from the modules rather than
from a list of names:
  - every parameter of a norm layer (BatchNorm, LayerNorm, GroupNorm, ...), by module type;
  - every parameter with at most one dimension (biases, LayerScale gammas) and every ``*.bias``
    (under FSDP, by the parameter's own shape, not its shard's);
  - whatever a module declares with timm's ``no_weight_decay()`` (names or ``fnmatch`` patterns
    relative to that module): timm's ``Xcit`` declares its Fourier position encoding
    (``pos_embed.*``), its cross-covariance attention the ``temperature``, ``Cait`` its
    ``pos_embed``.

The recipes under ``configs/`` use neither constructor: they decay what the official XCiT code
decayed (``configs/_base_/default_runtime.py``: only LayerNorms and F-SNE's codes skip weight decay).
``NoDecayOnScalesOptimizerConstructor`` is the opt-in deviation: the rules above but for biases,
which decay as in the official code, i.e. also LayerScale, XCA's temperature, the position
embeddings and every norm layer (BatchNorms included) skip weight decay. Its effect on the demo is
in docs/training.md.
"""
import fnmatch
from collections import OrderedDict
from typing import Dict, List, Optional, Set, Tuple

import torch.nn as nn
from mmengine.dist import get_dist_info
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_CONSTRUCTORS
from torch.nn.modules.batchnorm import _NormBase

from ...models.backbones.columnar import ColumnarBackbone
from ...registry import toolbox_registries

__all__ = ['ColumnarLayerDecayOptimizerConstructor', 'NoDecayOnScalesOptimizerConstructor']

#: every normalisation layer type of this torch: ``_NormBase`` (private in torch) is the base of the
#: batch and instance norms; ``nn.RMSNorm`` exists from torch 2.4
NORM_LAYERS: Tuple[type, ...] = (_NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm) + (
    (nn.RMSNorm,) if hasattr(nn, 'RMSNorm') else ())


def declared_no_weight_decay(module: nn.Module) -> List[str]:
    """Names, relative to ``module``, of its parameters that its ``no_weight_decay()`` declares:
    ``fnmatch`` patterns, or module names covering their parameters (timm's XCiT names its
    position encoding as a module, ``'pos_embed'``, before timm 1.0.31 and as a pattern,
    ``'pos_embed.*'``, from it on); none without one."""
    declared = getattr(module, 'no_weight_decay', None)
    if not callable(declared):
        return []
    patterns = set(declared())
    return [n for n, _ in module.named_parameters()
            if any(fnmatch.fnmatchcase(n, p) or n.startswith(p + '.') for p in patterns)]


def fsdp_original_ndims(model: nn.Module) -> Dict[int, int]:
    """``id(parameter) -> its number of dimensions`` for the parameters that FSDP (with
    ``use_orig_params=True``) turned into 1-d views of this process's shard: its ``FlatParameter``
    keeps the original parameters and their shapes (private attributes). Empty for a model
    without FSDP units."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    out = {}
    for m in model.modules():
        flat = m._flat_param if isinstance(m, FullyShardedDataParallel) else None
        if flat is not None and flat._params is not None:
            out.update((id(p), len(shape)) for p, shape in zip(flat._params, flat._shapes))
    return out


def no_weight_decay_names(model: nn.Module, biases: bool = True,
                          sharded_ndims: Optional[Dict[int, int]] = None) -> Set[str]:
    """Names (as in ``model.named_parameters()``) of the parameters that should not decay.

    Args:
        model (nn.Module): Any model; see the module docstring for the rules.
        biases (bool): Include every bias (``*.bias`` and 1-d parameters named so); with False, a
            bias is included only if another rule (a norm layer, a declaration) names it.
            Default: True.
        sharded_ndims (dict[int, int], optional): ``id(parameter) -> ndim`` of the parameters
            FSDP flattened (``fsdp_original_ndims`` of the wrapped model), whose own
            ``ndim`` is their shard's. Default: None.

    Returns:
        set[str]: Parameter names.
    """
    names = set()
    for mod_name, mod in model.named_modules():
        prefix = f'{mod_name}.' if mod_name else ''
        if isinstance(mod, NORM_LAYERS):
            names.update(prefix + n for n, _ in mod.named_parameters(recurse=False))
        names.update(prefix + n for n in declared_no_weight_decay(mod))
    sharded_ndims = sharded_ndims or {}
    for n, p in model.named_parameters():
        ndim = sharded_ndims.get(id(p), p.ndim)
        if n.endswith('.bias') and biases or ndim <= 1 and not n.endswith('.bias'):
            names.add(n)
    return names


class _ShardAware:
    """Keeps the FSDP-flattened parameters' own dimensions (``fsdp_original_ndims``)
    of the model as mmengine hands it over, before mmengine's ``__call__`` unwraps it to its
    ``.module`` (which no longer holds FSDP's root unit)."""

    def __call__(self, model: nn.Module):
        self._sharded_ndims = fsdp_original_ndims(model)
        return super().__call__(model)


def _find_backbone(model: nn.Module) -> Tuple[str, ColumnarBackbone]:
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, ColumnarBackbone)]
    if len(found) != 1:
        what = 'none' if not found else ', '.join(repr(n) for n, _ in found)
        raise ValueError(
            f'ColumnarLayerDecayOptimizerConstructor needs a model with exactly one columnar '
            f'backbone (XCiT, CaiT, TimmViT, TimmEVA, TimmBEiT), found {what} in '
            f"{type(model).__name__}. For other backbones use mmseg's/mmdet's "
            'LearningRateDecayOptimizerConstructor.')
    return found[0]


def layer_ids(model: nn.Module) -> Tuple[Dict[str, int], int]:
    """Layer of every parameter for layer-wise decay.

    Args:
        model (nn.Module): A model containing one ``ColumnarBackbone``.

    Returns:
        tuple[dict[str, int], int]: ``{parameter name: layer id}`` and the number of blocks
        ``L`` of the backbone's trunk: the trunk's parameters outside its blocks (patch
        embedding, position embedding/encoding) are layer 0, ``trunk.blocks.i`` layer ``i + 1``,
        all others (``ColumnarPyramid``, neck, heads) layer ``L + 1``.
    """
    bb_name, backbone = _find_backbone(model)
    trunk = f'{bb_name}.trunk.' if bb_name else 'trunk.'
    num_blocks = len(backbone.trunk.blocks)
    ids = {}
    for name, _ in model.named_parameters():
        if not name.startswith(trunk):
            ids[name] = num_blocks + 1
        elif name.startswith(trunk + 'blocks.'):
            ids[name] = int(name[len(trunk) + len('blocks.'):].split('.', 1)[0]) + 1
        else:
            ids[name] = 0
    return ids, num_blocks


class ColumnarLayerDecayOptimizerConstructor(_ShardAware, DefaultOptimWrapperConstructor):
    """mmengine's default constructor plus layer-wise lr decay and model-derived no-decay groups.

    Each parameter first gets what ``DefaultOptimWrapperConstructor`` gives it (so
    ``custom_keys``, ``bias_lr_mult`` and the other ``paramwise_cfg`` options still apply), then
    its lr is multiplied by ``decay_rate ** (num_layers + 1 - layer_id)`` and its weight decay set
    to 0 if the model says it should not decay (module docstring). Parameters with the same
    settings are merged into one group, which also records ``layer_id``, ``lr_scale``,
    ``decay`` (bool) and ``param_names``.

    Example::

        optim_wrapper = dict(
            type='OptimWrapper',
            constructor='ColumnarLayerDecayOptimizerConstructor',
            optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
            paramwise_cfg=dict(decay_rate=0.65))  # num_layers: the trunk's blocks

    Args:
        optim_wrapper_cfg (dict): The optimizer wrapper config (``optimizer=dict(...)``...).
        paramwise_cfg (dict): ``decay_rate`` (float in (0, 1], required), ``num_layers`` (int,
            optional: the number of blocks of the trunk, checked against the model) and any
            ``DefaultOptimWrapperConstructor`` option.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        rate = self.paramwise_cfg.get('decay_rate')
        if not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise ValueError(
                f'ColumnarLayerDecayOptimizerConstructor: paramwise_cfg.decay_rate must be a '
                f'number in (0, 1], got {rate!r} (e.g. paramwise_cfg=dict(decay_rate=0.65)).')
        self.decay_rate = float(rate)
        if self.base_lr is None:
            raise ValueError('ColumnarLayerDecayOptimizerConstructor: set optimizer.lr, the lr of '
                             'the last layer that the decay scales down.')
        self.num_layers = self.paramwise_cfg.get('num_layers')

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module=None) -> None:
        """Add the parameter groups of ``module`` (the whole model) to ``params``.

        Args:
            params (list[dict]): Parameter groups, extended in place.
            module (nn.Module): The model.
            prefix (str): Set by mmengine's recursion into submodules; '' for the model.
            is_dcn_module (int | float, optional): Passed on to mmengine's recursion.
        """
        if prefix:  # mmengine's recursion into submodules: per-parameter defaults
            super().add_params(params, module, prefix, is_dcn_module)
            return
        per_param: List[dict] = []
        super().add_params(per_param, module)

        ids, num_blocks = layer_ids(module)
        if self.num_layers is not None and self.num_layers != num_blocks:
            raise ValueError(
                f'ColumnarLayerDecayOptimizerConstructor: paramwise_cfg.num_layers='
                f'{self.num_layers}, but the backbone runs {num_blocks} blocks; set '
                f'num_layers={num_blocks} or leave it out.')
        no_decay = no_weight_decay_names(module, sharded_ndims=getattr(self, '_sharded_ndims', None))
        names = {id(p): n for n, p in module.named_parameters()}
        groups: Dict[tuple, dict] = OrderedDict()
        for group in per_param:
            (param,) = group.pop('params')
            if not param.requires_grad:  # mmengine 0.10.7 leaves them out, 0.10.3 does not
                continue
            name = names[id(param)]
            layer = ids[name]
            scale = self.decay_rate ** (num_blocks + 1 - layer)
            group['lr'] = group.get('lr', self.base_lr) * scale
            decay = name not in no_decay
            if not decay and self.base_wd is not None:
                group['weight_decay'] = 0.
            group.update(layer_id=layer, lr_scale=scale, decay=decay)
            key = tuple(sorted((k, repr(v)) for k, v in group.items()))
            merged = groups.setdefault(key, dict(group, params=[], param_names=[]))
            merged['params'].append(param)
            merged['param_names'].append(name)
        params.extend(groups.values())
        if get_dist_info()[0] == 0:
            print_log(self._summary(list(groups.values()), num_blocks), logger='current')

    def _summary(self, groups: List[dict], num_blocks: int) -> str:
        lines = [f'layer-wise lr decay {self.decay_rate} over {num_blocks} blocks '
                 f'(layer 0: embedding, 1..{num_blocks}: blocks, {num_blocks + 1}: the rest):']
        for g in groups:
            lines.append(f'  layer {g["layer_id"]:>2}  lr x{g["lr_scale"]:.4g}  '
                         f'{"decay   " if g["decay"] else "no decay"}  {len(g["params"]):>4} tensors'
                         f'  e.g. {g["param_names"][0]}')
        return '\n'.join(lines)


class NoDecayOnScalesOptimizerConstructor(_ShardAware, DefaultOptimWrapperConstructor):
    """mmengine's default constructor, then no weight decay on the scales: every norm layer's
    parameters (LayerNorm, BatchNorm, ... by type), 1-d parameters other than biases (LayerScale),
    and what timm's modules declare (XCA's temperature, the position embeddings); see
    ``no_weight_decay_names(model, biases=False)``. Biases decay. An opt-in deviation from the
    official recipes' rule (only LayerNorms skip decay)::

        python tools/train.py CONFIG --cfg-options \\
            optim_wrapper.constructor=NoDecayOnScalesOptimizerConstructor

    Args:
        optim_wrapper_cfg (dict): The optimizer wrapper config.
        paramwise_cfg (dict, optional): Any ``DefaultOptimWrapperConstructor`` option; its
            ``custom_keys`` apply first (the recipes' ``norm`` and ``qkv_codes``).
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        # mmengine groups parameters (calls add_params) only for a non-empty paramwise_cfg
        super().__init__(optim_wrapper_cfg, paramwise_cfg or dict(custom_keys={}))

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '',
                   is_dcn_module=None) -> None:
        """mmengine's groups, then weight decay 0 for those holding a scale (see the class);
        arguments as ``ColumnarLayerDecayOptimizerConstructor.add_params``."""
        first = len(params)
        super().add_params(params, module, prefix, is_dcn_module)
        if prefix or self.base_wd is None:  # mmengine's recursion, or no weight decay at all
            return
        names = no_weight_decay_names(module, biases=False,
                                      sharded_ndims=getattr(self, '_sharded_ndims', None))
        exempt = {id(p) for n, p in module.named_parameters() if n in names}
        for group in params[first:]:
            if any(id(p) in exempt for p in group['params']):
                group['weight_decay'] = 0.


for _registry in [MMENGINE_CONSTRUCTORS] + toolbox_registries('OPTIM_WRAPPER_CONSTRUCTORS'):
    _registry.register_module(module=ColumnarLayerDecayOptimizerConstructor)
    _registry.register_module(module=NoDecayOnScalesOptimizerConstructor)
