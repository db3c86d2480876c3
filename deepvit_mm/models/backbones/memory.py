"""The memory guard of a backbone's forward: an input whose activations cannot fit the device's
free memory is refused before anything is allocated, saying what to change. The estimate is the
family's (``ColumnarBackbone._activation_bytes``, a lower bound: the base counts the token maps,
CaiT adds its quadratic attention).
"""
from typing import Dict

import torch

from ...compat.torch import autocast_enabled
from .checks import free_memory

__all__ = ['check_memory']


def check_memory(backbone, x: torch.Tensor, checked: Dict[str, int]) -> None:
    """Refuse, before allocating, an input whose forward through ``backbone`` cannot fit the
    device's free memory. The device is asked only for a need larger than any found to fit
    before (on a GPU the question waits for the queued kernels), kept per device in ``checked``.
    """
    grid = (-(-x.shape[-2] // backbone.patch_size), -(-x.shape[-1] // backbone.patch_size))
    element = 2 if autocast_enabled(x.device.type) else x.element_size()
    need = backbone._activation_bytes(x.shape[0], grid, element, x.device)
    if need <= checked.get(str(x.device), -1):
        return
    free = free_memory(x.device)
    if free is None or need <= free:
        checked[str(x.device)] = need
    else:
        raise MemoryError(
            f'{type(backbone).__name__}({backbone.arch}): input {tuple(x.shape)} ({grid[0]}x'
            f'{grid[1]} patches) needs at least {need / 2**30:.1f} GiB for its activations, more '
            f'than the {free / 2**30:.1f} GiB free on {x.device}: {backbone._memory_remedy()}.')
