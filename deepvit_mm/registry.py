"""Register a class in mmdet's and mmseg's ``MODELS`` registries with one decorator."""
from typing import TypeVar

from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS

__all__ = ['register_model', 'MMDET_MODELS', 'MMSEG_MODELS']

T = TypeVar('T', bound=type)


def register_model(cls: T) -> T:
    """Class decorator: make ``cls`` buildable by ``type=cls.__name__`` in mmdet and mmseg."""
    MMDET_MODELS.register_module(module=cls)
    MMSEG_MODELS.register_module(module=cls)
    return cls
