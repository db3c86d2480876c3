"""Helpers that the checkpoints, the models and the engine all need, below each of them.

``unwrap_model``: the model that mmengine's wrappers hold."""
import torch.nn as nn

__all__ = ['unwrap_model']


def unwrap_model(module: nn.Module) -> nn.Module:
    """The detector or segmentor inside mmengine's model wrappers (``MMDistributedDataParallel``,
    ...) and test-time augmentation models (``BaseTTAModel``), as mmengine holds it."""
    from mmengine.model import BaseTTAModel, is_model_wrapper
    while is_model_wrapper(module) or isinstance(module, BaseTTAModel):
        module = module.module
    return module
