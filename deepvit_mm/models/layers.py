"""Layers the recipes name that mmcv does not register, and the layer types the models tell apart.

``LN2d``: timm's ``LayerNorm2d`` (a LayerNorm over the channels of each pixel of an NCHW map),
ViTDet's norm of its feature pyramid, neck and heads (Li et al., ECCV 2022; mmdet's
``projects/ViTDet`` registers its own copy under the same name in mmdet's registry, which a
config inside that project still finds first). Registered in mmengine's root ``MODELS``, where
mmcv's ``build_norm_layer`` looks up norm layers from every scope, unless the name is taken.

``BatchNormBase``, ``ConvBase``: the base classes of torch's batch norms (SyncBatchNorm included)
and convolutions, private in torch (``torch.nn.modules.batchnorm._BatchNorm``, ``conv._ConvNd``,
torch 2.1 to 2.14; mmcv tells layers apart by the same classes).
"""
from mmengine.registry import MODELS
from timm.layers import LayerNorm2d
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

__all__ = ['LayerNorm2d']

BatchNormBase = _BatchNorm
ConvBase = _ConvNd

if 'LN2d' not in MODELS.module_dict:
    MODELS.register_module(name='LN2d', module=LayerNorm2d)
