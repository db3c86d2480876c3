"""Which family, and which of its archs, a checkpoint is: every family registers itself
(``CheckpointFamilies.families``, the subclasses of ``ColumnarBackbone`` with an arch table of
their own) and says what its checkpoints' tensors show of the arch (``state_dict_traits``); the
loader's refusals name the family and arch found (``weights.ColumnarWeights.describe_state_dict``).
"""
import re
from typing import ClassVar, Dict, Iterable, List, Mapping, Optional, Type

import torch

from .arguments import ColumnarArguments

__all__ = []


class CheckpointFamilies:
    """Mixin of ``ColumnarBackbone``: the registry of families, and the arch a converted state
    dict (trunk keys) was trained as. A family defines ``state_dict_traits``; the timm families
    look among their examples only (``_named_archs``)."""
    #: every family (a subclass with an arch table), in the order they were defined
    families: ClassVar[List[Type]] = []

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.arch_zoo is not ColumnarArguments.arch_zoo:  # a table: a family (nothing read)
            cls.families.append(cls)

    @classmethod
    def state_dict_traits(cls, state_dict: Mapping[str, torch.Tensor]) -> Optional[Dict[str, int]]:
        """The ``ArchSpec`` fields that tell this family's archs apart (``embed_dim``, ``depth``,
        ...), as a converted state dict (trunk keys) shows them; None if it is not this family's."""
        return None

    @classmethod
    def _named_archs(cls) -> Iterable[str]:
        """The archs ``arch_from_state_dict`` looks among: every arch of ``arch_zoo``."""
        return cls.arch_zoo

    @classmethod
    def arch_from_state_dict(cls, state_dict: Mapping[str, torch.Tensor]) -> Optional[str]:
        """The arch a converted state dict was trained as: the first of ``_named_archs`` with its
        ``state_dict_traits``; None if it is not this family's or no arch has them."""
        return cls.arch_with_traits(cls.state_dict_traits(state_dict))

    @classmethod
    def arch_with_traits(cls, traits: Optional[Dict[str, int]]) -> Optional[str]:
        """The first of ``_named_archs`` whose spec has ``traits``; None if none has them."""
        if traits is None:
            return None
        return next((name for name in cls._named_archs()
                     if all(getattr(cls.arch_zoo[name], k) == v for k, v in traits.items())), None)


def count_blocks(state_dict: Mapping[str, torch.Tensor], prefix: str = 'trunk.blocks.') -> int:
    """Number of blocks ``prefix{i}.*`` in a state dict."""
    ids = {int(m.group(1)) for k in state_dict for m in [re.match(re.escape(prefix) + r'(\d+)\.', k)]
           if m}
    return max(ids) + 1 if ids else 0
