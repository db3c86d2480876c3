"""The backbones: XCiT and CaiT on ``ColumnarBackbone``, with the ``ColumnarPyramid`` adapter."""
from .cait import CaiT, GridTalkingHeadAttn
from .columnar import ColumnarBackbone
from .columnar_pyramid import ColumnarPyramid
from .xcit import XCiT

__all__ = ['CaiT', 'ColumnarBackbone', 'ColumnarPyramid', 'GridTalkingHeadAttn', 'XCiT']
