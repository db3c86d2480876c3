"""Register a class in the ``MODELS`` registries of mmdet and mmseg, those installed, with one
decorator."""
import importlib
from typing import List, TypeVar

from ._deps import installed_toolboxes
from .version import TOOLBOXES

__all__ = ['register_model', 'toolbox_registries', 'MMDET_MODELS', 'MMSEG_MODELS']

T = TypeVar('T', bound=type)


def _registry(pkg: str, name: str):
    """The registry ``name`` of ``pkg`` (a ``version.TOOLBOXES`` distribution), or None when it is
    not installed."""
    if pkg not in installed_toolboxes():
        return None
    return getattr(importlib.import_module(f'{TOOLBOXES[pkg]["module"]}.registry'), name)


def toolbox_registries(name: str) -> List:
    """The registry ``name`` (``'MODELS'``, ``'OPTIM_WRAPPER_CONSTRUCTORS'``) of mmdet and of
    mmseg, of those installed (``version.TOOLBOXES``)."""
    return [_registry(pkg, name) for pkg in installed_toolboxes()]


MMDET_MODELS = _registry('mmdet', 'MODELS')  # None without mmdet
MMSEG_MODELS = _registry('mmsegmentation', 'MODELS')  # None without mmsegmentation


def register_model(cls: T) -> T:
    """Class decorator: make ``cls`` buildable by ``type=cls.__name__`` in mmdet and mmseg (those
    installed)."""
    for models in toolbox_registries('MODELS'):
        models.register_module(module=cls)
    return cls
