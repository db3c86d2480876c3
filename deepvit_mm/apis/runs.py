"""What the tools do around the run they start, beside its config (``config``)."""
import contextlib
import gc
from typing import Iterator

__all__ = ['objects_frozen']


@contextlib.contextmanager
def objects_frozen() -> Iterator[None]:
    """``gc.freeze()`` for the block: what exists when it starts (the libraries' modules, the
    config, the model) is never walked by a collection again (docs/training.md#tools), and forked
    data workers share its pages instead of copying them.

    Thawed at the block's end, so that the interpreter's exit frees it as usual: objects left
    frozen are never freed, and extension modules built with nanobind report them at exit
    ("nanobind: leaked 514 functions!" on stderr after every run: triton 3.9, which torch 2.15
    brings and timm imports through torchvision).
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
