"""The backbones: XCiT and CaiT, and timm's ViT, EVA-02 and BEiT, on ``ColumnarBackbone``, with the
``ColumnarPyramid`` adapter."""
from .cait import CaiT, GridTalkingHeadAttn
from .columnar import ColumnarBackbone
from .columnar_pyramid import ColumnarPyramid
from .vit import TimmBEiT, TimmEVA, TimmViT
from .xcit import XCiT

__all__ = ['CaiT', 'ColumnarBackbone', 'ColumnarPyramid', 'GridTalkingHeadAttn', 'TimmBEiT',
           'TimmEVA', 'TimmViT', 'XCiT']
