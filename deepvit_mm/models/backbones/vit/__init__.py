"""timm's other columnar transformers: ViT (DeiT, DeiT III, AugReg, DINOv2), EVA-02 and
BEiT on ``ColumnarBackbone``, each family taking any name of its timm module (``model``)."""
from .model import TimmArchTable, TimmBEiT, TimmColumnar, TimmEVA, TimmViT

__all__ = ['TimmArchTable', 'TimmBEiT', 'TimmColumnar', 'TimmEVA', 'TimmViT']
