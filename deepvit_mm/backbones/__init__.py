from .columnar import ColumnarBackbone
from .xcit import XCiT

__all__ = ['ColumnarBackbone', 'XCiT']
