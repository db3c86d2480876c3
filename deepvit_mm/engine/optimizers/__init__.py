"""Optimizer wrappers and their constructors: mixed precision on CPU (``cpu_amp_optim_wrapper``),
layer-wise lr decay and weight-decay exemptions for columnar backbones
(``optim_wrapper_constructors``)."""
from .cpu_amp_optim_wrapper import CPUAmpOptimWrapper, fit_precision_to_device
from .optim_wrapper_constructors import (
           ColumnarLayerDecayOptimizerConstructor,
           NoDecayOnScalesOptimizerConstructor,
)

__all__ = ['CPUAmpOptimWrapper', 'fit_precision_to_device',
           'ColumnarLayerDecayOptimizerConstructor', 'NoDecayOnScalesOptimizerConstructor']
