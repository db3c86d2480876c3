"""Which family, and which of its archs, a checkpoint is: each family says what its checkpoints'
tensors show of the arch (``ColumnarBackbone.state_dict_traits``), and these functions ask every
family of ``ColumnarBackbone.families``; the loader's refusals name the family and arch found
(``describe_state_dict``).
"""
import re
from typing import Mapping, Optional, Sequence

import torch

__all__ = []


def arch_from_state_dict(family, state_dict: Mapping[str, torch.Tensor]) -> Optional[str]:
    """The arch of ``family`` (a ``ColumnarBackbone`` subclass) a converted state dict (trunk
    keys) was trained as: the first of its table's ``examples`` with the family's
    ``state_dict_traits``; None if it is not this family's or no arch has them."""
    return family.arch_zoo.arch_with(family.state_dict_traits(state_dict))


def describe_state_dict(families: Sequence, state_dict: Mapping[str, torch.Tensor]) -> str:
    """What ``state_dict`` (trunk keys) looks like, for a refusal's message: the first of
    ``families`` whose traits it has, and its arch where one of the table has them."""
    for fam in families:
        traits = fam.state_dict_traits(state_dict)
        if traits is None:
            continue
        arch = fam.arch_zoo.arch_with(traits)
        if arch is not None:
            return f'It looks like a checkpoint of {fam.__name__}(arch={arch!r})'
        found = ', '.join(f'{k}={v}' for k, v in traits.items())
        return (f'It looks like a checkpoint of {fam.__name__} ({found}), of none of the archs '
                f'deepvit_mm names')
    names = ', '.join(fam.__name__ for fam in families)
    return f'It is not a checkpoint of a model deepvit_mm knows ({names})'


def count_blocks(state_dict: Mapping[str, torch.Tensor], prefix: str = 'trunk.blocks.') -> int:
    """Number of blocks ``prefix{i}.*`` in a state dict."""
    ids = {int(m.group(1)) for k in state_dict for m in [re.match(re.escape(prefix) + r'(\d+)\.', k)]
           if m}
    return max(ids) + 1 if ids else 0
