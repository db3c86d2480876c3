"""XCiT: the backbone and its arch table (``model``), the faster block forward
(``fast``, the ``gram_xca`` switch) and the non-linear Q/K/V embeddings (``qkv``)."""
from .model import XCiT

__all__ = ['XCiT']
