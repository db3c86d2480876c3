"""The models a benchmark measures, built through the registries as a config would build them.

* a backbone named by its arch (``small_12_p8``, ``s24``, timm names too): the family that knows
  the name (XCiT, CaiT, any ``ColumnarBackbone`` subclass) is built by ``type`` through mmdet's
  ``MODELS``, exactly as ``model.backbone`` of a config is;
* a config's whole detector or segmentor: mmdet's or mmseg's ``MODELS`` by the config's
  ``default_scope`` (``deepvit_mm.runtime.task_of``), with no weights file and SyncBN reverted to BN
  (one process, as any single-process run).
"""
import os
from typing import Optional, Tuple, Type

import torch.nn as nn

__all__ = ['is_config', 'model_label', 'backbone_family', 'build_backbone', 'load_config',
           'build_from_config', 'num_classes_of', 'padded_size',
           'backbone_info']


def is_config(model: str) -> bool:
    """Whether ``model`` names a config file (rather than a backbone arch)."""
    return str(model).endswith('.py')


def model_label(model: str) -> str:
    """The name a report shows: a config's file stem, or the arch as given."""
    return os.path.splitext(os.path.basename(model))[0] if is_config(model) else model


def backbone_family(arch: str) -> Type[nn.Module]:
    """The ``ColumnarBackbone`` subclass whose arch table knows ``arch``.

    Raises:
        ValueError: No family knows it (the message lists every family's valid names).
    """
    from ..backbones import ColumnarBackbone
    errors = []
    for family in ColumnarBackbone.families:
        try:
            family.resolve_arch(arch)
            return family
        except (ValueError, TypeError) as e:
            errors.append(str(e))
    raise ValueError(f'no backbone family knows arch {arch!r}:\n  ' + '\n  '.join(errors))


def build_backbone(arch: str, **kwargs) -> nn.Module:
    """``MODELS.build(dict(type=<family>, arch=arch, **kwargs))`` (mmdet's registry, where
    deepvit_mm registers every family), without pretrained weights."""
    from ..registry import MMDET_MODELS
    return MMDET_MODELS.build(dict(type=backbone_family(arch).__name__, arch=arch, **kwargs))


def load_config(path: str, cfg_options: Optional[dict] = None):
    """Read a config for measuring its model: ``cfg_options`` merged, no weights file
    (``model.backbone.init_cfg`` and mmseg's ``model.pretrained`` cleared: cost and memory do not
    depend on the weights); a float16 ``AmpOptimWrapper`` trains in float32 without a GPU, as
    ``tools/train.py`` runs it."""
    from mmengine.config import Config

    from ..runtime import fit_precision_to_device
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    fit_precision_to_device(cfg)
    if cfg.model.get('backbone') is not None:
        cfg.model.backbone.init_cfg = None
    if 'pretrained' in cfg.model:
        cfg.model.pretrained = None
    return cfg


def build_from_config(cfg, cfg_options: Optional[dict] = None) -> Tuple[nn.Module, str]:
    """A config's detector or segmentor with random (initialised) weights.

    Args:
        cfg (str | Config): A config file (read with ``load_config``) or a loaded config; an
            mmdet or mmseg config with a deepvit_mm backbone.
        cfg_options (dict, optional): Overrides, as ``--cfg-options`` gives them (for a file).

    Returns:
        tuple[nn.Module, str]: the model (SyncBN reverted to BN) and its task, ``'det'`` or
        ``'seg'``.
    """
    from mmengine.model.utils import revert_sync_batchnorm
    from mmengine.registry import DefaultScope

    from ..runtime.config import task_of
    if isinstance(cfg, str):
        cfg = load_config(cfg, cfg_options)
    task = task_of(cfg)
    if task == 'seg':
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    # the config's scope while building only: the caller's default scope stays as it was
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmdet')):
        model = revert_sync_batchnorm(MODELS.build(cfg.model))
        model.init_weights()
    return model, task


def num_classes_of(model: nn.Module, task: str) -> int:
    """Classes the heads predict (for random targets): the seg decode head's, the RoI box
    head's, or a one-stage head's; 80 (COCO) when none says."""
    if task == 'seg':
        return int(model.decode_head.num_classes)
    for head in (getattr(getattr(model, 'roi_head', None), 'bbox_head', None),
                 getattr(model, 'bbox_head', None)):
        if head is not None and hasattr(head, 'num_classes'):
            return int(head.num_classes)
    return 80


def backbone_info(backbone: nn.Module, size: Tuple[int, int]) -> dict:
    """What a report says about a built backbone at input ``size``: its family and arch,
    ``blocks`` built, ``tokens`` per image (padded input), ``with_cp``, and CaiT's
    ``window_size`` and ``global_blocks`` where it has them."""
    h, w = padded_size(backbone, size)
    p = backbone.patch_size
    info = dict(family=type(backbone).__name__, arch=backbone.arch,
                blocks=len(backbone.trunk.blocks), tokens=(h // p) * (w // p),
                with_cp=bool(backbone.with_cp))
    if hasattr(backbone, 'window_size'):
        info.update(window_size=backbone.window_size, global_blocks=list(backbone.global_blocks))
    return info


def padded_size(backbone: nn.Module, size: Tuple[int, int]) -> Tuple[int, int]:
    """The input size the backbone's trunk sees (padded to ``pad_to`` when ``pad_input``)."""
    h, w = size
    if getattr(backbone, 'pad_input', True):
        h, w = h + (-h) % backbone.pad_to, w + (-w) % backbone.pad_to
    return h, w
