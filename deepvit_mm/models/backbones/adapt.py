"""The one way the backbones change what a module of timm's trunk does: ``adapt`` gives the built
module a subclass of its timm class, in place.

The subclass adds behaviour only (a forward, attributes), no parameter nor buffer: the module
keeps its parameters, buffers, state-dict keys and hooks, timm's own code around it
(``forward_intermediates``, its gradient checkpointing) calls it as before, ``isinstance`` with
timm's class holds (FSDP's wrap policy, the attention maps' tools), and adapting it back to timm's
class restores timm's forward. Its users: ViT's windows (``vit.window_attention.use_windows``),
CaiT's grid and query-chunked attention (``cait.window_attention.GridTalkingHeadAttn``) and XCiT's
faster block forward (``xcit.fast``'s block classes, the ``gram_xca`` switch).
"""
from typing import Any, Optional, Type, TypeVar

import torch.nn as nn

__all__ = ['adapt']

M = TypeVar('M', bound=nn.Module)


def timm_class(cls: type) -> Optional[type]:
    """The first class of ``cls``'s method resolution order that timm defines (``cls`` itself for
    a timm class); None if it has none."""
    return next((c for c in cls.__mro__ if c.__module__.split('.')[0] == 'timm'), None)


def adapt(module: nn.Module, cls: Type[M], **attrs: Any) -> M:
    """Make ``module``, built by timm, an instance of ``cls``, in place.

    Args:
        module (nn.Module): A module of a timm model, as timm built it or adapted before.
        cls (type): timm's class of ``module``, or a subclass of it that adds no parameters or
            buffers.
        attrs: Attributes set on ``module`` (the subclass's settings, e.g. ``window_size``).

    Returns:
        nn.Module: ``module`` itself, its class ``cls``.

    Raises:
        TypeError: ``module`` is not of ``cls``'s timm class (another timm class, or a subclass
            of it that timm defines).
    """
    base = timm_class(cls)
    if base is None or timm_class(type(module)) is not base:
        raise TypeError(f'{cls.__name__} adapts timm\'s '
                        f'{base.__name__ if base else "modules"}, got {type(module).__name__}')
    module.__class__ = cls
    for name, value in attrs.items():
        setattr(module, name, value)
    return module
