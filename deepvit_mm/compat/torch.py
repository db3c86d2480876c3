"""What differs between the torch releases deepvit_mm supports that more than one part of it meets.

Tested at both ends (``deepvit_mm.version.TESTED``): torch 2.1.0, the release OpenMMLab's mmcv
2.1.0 wheels for torch 2.1 are built against, and the newest stack's torch. The autocast queries
pick the API by what the installed torch has (feature detection, not a version table), so a torch
in between takes whichever of the two tested paths its API supports; a feature that a torch in
between has and fails with goes by release (``TORCH_VERSION`` against
``deepvit_mm.version.FEATURE_FLOORS``).

* ``TORCH_VERSION``: the running torch's release number, which the checkpoint reader (torch 2.6's
  ``safe_globals``), ONNX export and sharded training on CPU go by.
* ``autocast_enabled`` / ``autocast_dtype``: ``torch.is_autocast_enabled(device_type)`` and
  ``torch.get_autocast_dtype`` (2.4+); torch 2.1 has the CUDA-only argument-less forms and
  ``is_autocast_cpu_enabled`` / ``get_autocast_cpu_dtype``. Asked by the backbones and by mixed
  precision on CPU (the engine)."""
import torch

from ..version import release

__all__ = ['TORCH_VERSION', 'autocast_enabled', 'autocast_dtype']


#: the running torch's release number, ``(2, 13, 0)`` for ``2.13.0+cpu`` and ``2.13.0rc1`` alike:
#: features are gated by release, and a pre-release or vendor build of one has its features
TORCH_VERSION = release(torch.__version__).release


def _autocast_api_takes_device() -> bool:
    try:
        torch.is_autocast_enabled('cpu')
        return True
    except TypeError:  # torch < 2.4: is_autocast_enabled() takes no argument
        return False


_DEVICE_API = _autocast_api_takes_device()


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False for types autocast does not know, such as
    ``meta``, on which FLOP counting runs the model)."""
    if _DEVICE_API:
        try:
            return torch.is_autocast_enabled(device_type)
        except RuntimeError:  # "unknown device type for autocast"
            return False
    if device_type == 'cpu':
        return torch.is_autocast_cpu_enabled()
    if device_type == 'cuda':
        return torch.is_autocast_enabled()
    return False


def autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype autocast computes in on ``device_type`` (meaningful where it is enabled)."""
    if _DEVICE_API:
        return torch.get_autocast_dtype(device_type)
    if device_type == 'cpu':
        return torch.get_autocast_cpu_dtype()
    return torch.get_autocast_gpu_dtype()
