"""The memory guard of a backbone's forward: an input whose activations cannot fit the device's
free memory is refused before anything is allocated, saying what to change. The estimate
(``_activation_bytes``, a lower bound) is the family's: the base counts the token maps, CaiT adds
its quadratic attention.
"""
from typing import Dict, Tuple

import torch

from ...compat.torch import autocast_enabled
from .checks import free_memory

__all__ = ['MemoryGuard']


class MemoryGuard:
    """Mixin of ``ColumnarBackbone``: ``_check_memory(x)`` before a forward (on a GPU the question
    waits for the queued kernels, so the device is asked only for a need larger than any found to
    fit before, kept per device in ``_memory_checked``)."""
    _memory_checked: Dict[str, int]

    def _activation_bytes(self, batch: int, grid: Tuple[int, int], element: int,
                          device: torch.device) -> int:
        """A lower bound of the memory one forward needs beyond the weights: the family adds its
        attention (CaiT's is quadratic in tokens). Here: four token maps of the widest block
        (input, norm, and the MLP's 4x hidden) live at once; training keeps each block's."""
        tokens = batch * grid[0] * grid[1]
        per_block = tokens * self.embed_dim * element * 6
        if torch.is_grad_enabled() and self.training and not self.with_cp:
            return per_block * self._kept_blocks
        return per_block

    def _memory_remedy(self) -> str:
        return 'use smaller inputs, or with_cp=True for training'

    def _check_memory(self, x: torch.Tensor) -> None:
        """Refuse, before allocating, an input whose forward cannot fit the device's free memory.
        Asks the device only for a need larger than any found to fit before (on a GPU the
        question waits for the queued kernels)."""
        grid = (-(-x.shape[-2] // self.patch_size), -(-x.shape[-1] // self.patch_size))
        element = 2 if autocast_enabled(x.device.type) else x.element_size()
        need = self._activation_bytes(x.shape[0], grid, element, x.device)
        if need <= self._memory_checked.get(str(x.device), -1):
            return
        free = free_memory(x.device)
        if free is None or need <= free:
            self._memory_checked[str(x.device)] = need
        else:
            raise MemoryError(
                f'{type(self).__name__}({self.arch}): input {tuple(x.shape)} ({grid[0]}x{grid[1]} '
                f'patches) needs at least {need / 2**30:.1f} GiB for its activations, more than '
                f'the {free / 2**30:.1f} GiB free on {x.device}: {self._memory_remedy()}.')
