"""The models a benchmark measures, built through the registries as a config builds them: a
backbone by arch (its family found by the arch name, built by ``type`` through ``MODELS``), or a
config's detector or segmentor (``deepvit_mm.apis``' ``build_from_config``)."""
import contextlib
import os
from typing import Dict, Iterator, Tuple, Type, Union

import torch.nn as nn

from deepvit_mm.apis.config import build_from_config, load_config, num_classes_of

__all__ = ['load_config', 'build_from_config', 'num_classes_of']


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
    from deepvit_mm.models.backbones import ColumnarBackbone
    errors = []
    for family in ColumnarBackbone.families:
        try:
            family.arch_zoo.resolve(arch, family.__name__)
            return family
        except (ValueError, TypeError) as e:
            errors.append(str(e))
    raise ValueError(f'no backbone family knows arch {arch!r}:\n  ' + '\n  '.join(errors))


def build_backbone(arch: str, **kwargs) -> nn.Module:
    """``MODELS.build(dict(type=<family>, arch=arch, **kwargs))`` (mmdet's registry, or mmseg's
    without mmdet), without pretrained weights."""
    from deepvit_mm.registry import MMDET_MODELS, MMSEG_MODELS
    models = MMDET_MODELS if MMDET_MODELS is not None else MMSEG_MODELS
    return models.build(dict(type=backbone_family(arch).__name__, arch=arch, **kwargs))


def padded_size(backbone: nn.Module, size: Tuple[int, int]) -> Tuple[int, int]:
    """The input size the backbone's trunk sees (padded when ``pad_input``)."""
    return backbone._padded_size(*size) if getattr(backbone, 'pad_input', True) else tuple(size)


def backbone_info(backbone: nn.Module, size: Tuple[int, int]) -> dict:
    """A built backbone at input ``size``: family, arch, ``blocks``, ``tokens`` per image,
    ``with_cp``, and ``window_size`` / ``global_blocks`` where it has them."""
    h, w = padded_size(backbone, size)
    p = backbone.patch_size
    info = dict(family=type(backbone).__name__, arch=backbone.arch,
                blocks=len(backbone.trunk.blocks), tokens=(h // p) * (w // p),
                with_cp=bool(backbone.with_cp))
    if hasattr(backbone, 'window_size'):
        info.update(window_size=backbone.window_size, global_blocks=list(backbone.global_blocks))
    return info


def speed_options(backbone: nn.Module) -> Dict[str, Union[bool, str]]:
    """The family's switch of its faster forward as set (``{'gram_xca': 'auto'}``); {} if none."""
    name = getattr(backbone, 'fast_path_name', '')
    return {name: getattr(backbone, name)} if name else {}


@contextlib.contextmanager
def reference_forward(backbone: nn.Module) -> Iterator[None]:
    """Inside the block the backbone runs timm's own forward (its faster forward off: the
    multiply-adds the papers count); the switch is restored after."""
    name = getattr(backbone, 'fast_path_name', '')
    mode = getattr(backbone, name) if name else None
    if name:
        setattr(backbone, name, False)
    try:
        yield
    finally:
        if name:
            setattr(backbone, name, mode)
