from .cait import CaiT
from .columnar import ColumnarBackbone
from .window_attention import GridTalkingHeadAttn
from .xcit import XCiT

__all__ = ['CaiT', 'ColumnarBackbone', 'GridTalkingHeadAttn', 'XCiT']
