"""CaiT: the backbone, its arch table and position-embedding resampling (``model``), and
its windowed and query-chunked talking-heads attention (``window_attention``)."""
from .model import CaiT
from .window_attention import GridTalkingHeadAttn

__all__ = ['CaiT', 'GridTalkingHeadAttn']
