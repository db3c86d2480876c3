"""Layers the recipes name that mmcv does not register.

``LN2d``: timm's ``LayerNorm2d`` (a LayerNorm over the channels of each pixel of an NCHW map),
ViTDet's norm of its feature pyramid, neck and heads (Li et al., ECCV 2022; mmdet's
``projects/ViTDet`` registers its own copy under the same name in mmdet's registry, which a
config inside that project still finds first). Registered in mmengine's root ``MODELS``, where
mmcv's ``build_norm_layer`` looks up norm layers from every scope, unless the name is taken.
"""
from mmengine.registry import MODELS
from timm.layers import LayerNorm2d

__all__ = ['LayerNorm2d']

if 'LN2d' not in MODELS.module_dict:
    MODELS.register_module(name='LN2d', module=LayerNorm2d)
