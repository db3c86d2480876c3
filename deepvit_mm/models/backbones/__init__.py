from .cait import CaiT, GridTalkingHeadAttn
from .columnar import ColumnarBackbone
from .xcit import XCiT

__all__ = ['CaiT', 'ColumnarBackbone', 'GridTalkingHeadAttn', 'XCiT']
