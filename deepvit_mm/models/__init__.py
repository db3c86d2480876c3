"""The models: the XCiT and CaiT backbones with their ``ColumnarPyramid`` (``backbones``), a RoI
extractor for mmdet's RoI heads (``roi_heads``, imported only with mmdet), and the check of the
neck and heads a backbone feeds (``utils``)."""
from .backbones import CaiT, ColumnarBackbone, ColumnarPyramid, GridTalkingHeadAttn, XCiT
from .utils import ChannelMismatchError, check_consumers, check_model

__all__ = ['CaiT', 'ColumnarBackbone', 'ColumnarPyramid', 'GridTalkingHeadAttn', 'XCiT',
           'ChannelMismatchError', 'check_consumers', 'check_model']
