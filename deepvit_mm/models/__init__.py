"""The models: the XCiT, CaiT and timm ViT / EVA-02 / BEiT backbones with their ``ColumnarPyramid``
(``backbones``), a RoI extractor for mmdet's RoI heads (``roi_heads``, imported only with mmdet),
and the check of the neck and heads a backbone feeds (``utils``)."""
from . import layers  # noqa: F401  (registers LN2d)
from .backbones import (
    CaiT,
    ColumnarBackbone,
    ColumnarPyramid,
    GridTalkingHeadAttn,
    TimmBEiT,
    TimmEVA,
    TimmViT,
    XCiT,
)
from .utils import ChannelMismatchError, check_consumers, check_model

__all__ = ['CaiT', 'ColumnarBackbone', 'ColumnarPyramid', 'GridTalkingHeadAttn', 'TimmBEiT',
           'TimmEVA', 'TimmViT', 'XCiT',
           'ChannelMismatchError', 'check_consumers', 'check_model']
