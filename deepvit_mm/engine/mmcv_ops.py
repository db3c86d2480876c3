"""Whether mmcv's compiled ops can run where the model is: a model on a GPU that calls mmcv's ops
(RoIAlign, nms, deformable attention...) beside an mmcv compiled without CUDA would fail at its
first such call, inside mmcv's dispatcher, after the data and the model were loaded.
``tools/train.py`` and ``tools/test.py`` ask before the run starts and stop with one line."""
from typing import Any, List, Optional

import torch

__all__ = ['mmcv_ops_device_problem']


def _has_nms(cfg: Any) -> bool:
    """Whether a (nested) config asks for mmcv's nms: mmdet's heads name it as ``nms=dict(...)``."""
    if isinstance(cfg, dict):
        return any(k == 'nms' and v is not None or _has_nms(v) for k, v in cfg.items())
    if isinstance(cfg, (list, tuple)):
        return any(_has_nms(v) for v in cfg)
    return False


def mmcv_ops_used(model: torch.nn.Module) -> List[str]:
    """The mmcv ops a model calls: its modules of ``mmcv.ops`` (``RoIAlign``...), and ``nms``
    where a head's ``train_cfg`` or ``test_cfg`` asks for it."""
    used = set()
    for module in model.modules():
        if type(module).__module__.startswith('mmcv.ops'):
            used.add(type(module).__name__)
        if any(_has_nms(getattr(module, k, None)) for k in ('train_cfg', 'test_cfg')):
            used.add('nms')
    return sorted(used)


def mmcv_ops_device_problem(model: torch.nn.Module,
                            device: Optional[torch.device] = None) -> Optional[str]:
    """One line that says why the model's mmcv ops cannot run on its device, and what to do;
    None where they can (a CPU model, an mmcv compiled with CUDA, a model calling none of them).

    Args:
        model (nn.Module): The model as the Runner placed it (wrappers included); a config
            (mmengine's FlexibleRunner, which builds the model when the run starts) is passed.
        device (torch.device, optional): Where it runs; default: where its first parameter is.
    """
    if not isinstance(model, torch.nn.Module):  # FlexibleRunner builds it in train(): a config
        return None
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device('cpu')
    if torch.device(device).type != 'cuda':
        return None
    try:
        import mmcv.ops
        built = mmcv.ops.get_compiling_cuda_version()
    except (ImportError, AttributeError):  # no compiled ops: mmcv's own import error says so
        return None
    if built != 'not available':
        return None
    used = mmcv_ops_used(model)
    if not used:
        return None
    return (f"the model runs on the GPU and calls mmcv's {', '.join(used)}, but this mmcv "
            f'{mmcv.__version__} was compiled without CUDA ops, so its first call would fail: run '
            f'`make setup` on this machine (it builds mmcv\'s CUDA ops for torch '
            f'{torch.__version__}, docs/install.md#on-a-gpu), or install an mmcv built with CUDA '
            'for this torch')
