"""Runner-side pieces: mixed precision on CPU and the config handling shared by tools/."""
import ctypes
import ctypes.util
import os.path as osp
import sys
from contextlib import contextmanager
from typing import Optional

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from .cpu_autocast import run_mmcv_ops_in_float32
from .runtime.hooks import RNGStateHook  # noqa: F401  (its former home)

__all__ = ['CPUAmpOptimWrapper', 'RNGStateHook', 'task_of', 'prepare_config',
           'enable_visualization', 'keep_freed_cpu_memory']


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """bfloat16 autocast on CPU (mmengine's ``AmpOptimWrapper`` requires a GPU). bfloat16 has
    float32's exponent range, so no loss scaling is needed. mmcv's compiled ops, whose CPU
    kernels take float32 only, run in float32 inside it (``deepvit_mm.cpu_autocast``).

    Args:
        dtype (str): Autocast dtype. Default: ``'bfloat16'``.
        kwargs: ``OptimWrapper`` arguments.
    """

    def __init__(self, dtype: str = 'bfloat16', **kwargs) -> None:
        super().__init__(**kwargs)
        self.cast_dtype = getattr(torch, dtype)
        run_mmcv_ops_in_float32()
        if self.cast_dtype == torch.bfloat16 and not _cpu_has_bfloat16():
            print_log(f'--amp: this CPU ({torch.backends.cpu.get_cpu_capability()}) has no native '
                      'bfloat16 (AVX512-BF16 or AMX): bfloat16 convolutions and matrix products '
                      'are emulated and much slower than float32 here.', logger='current',
                      level=30)

    @contextmanager
    def optim_context(self, model: nn.Module):
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield


def _cpu_has_bfloat16() -> bool:
    # reason: torch.cpu exposes these checks only under private names (torch 2.x)
    checks = ('_is_avx512_bf16_supported', '_is_amx_tile_supported')
    return any(getattr(torch.cpu, c, lambda: False)() for c in checks)


def task_of(cfg: Config) -> str:
    """``'det'`` or ``'seg'``, from the config's ``default_scope`` (set by mmdet/mmseg bases)."""
    scope = cfg.get('default_scope', 'mmdet')
    if scope not in ('mmdet', 'mmseg'):
        raise ValueError(f'unsupported default_scope {scope!r}: configs must inherit an mmdet or '
                         'mmseg base (default_scope "mmdet" or "mmseg").')
    return 'det' if scope == 'mmdet' else 'seg'


def prepare_config(config: str, *, work_dir: Optional[str] = None, cfg_options=None,
                   launcher: str = 'none', amp: bool = False, resume: Optional[str] = None,
                   load_from: Optional[str] = None) -> Config:
    """Read ``config`` and apply the usual mm command-line options (as mmdet/mmseg tools do)."""
    if not osp.isfile(config):
        raise FileNotFoundError(f'config not found: {config!r}')
    cfg = Config.fromfile(config)
    task_of(cfg)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config))[0])
    if amp:
        if torch.cuda.is_available():
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'
        else:
            cfg.optim_wrapper.type = 'CPUAmpOptimWrapper'
            cfg.optim_wrapper.dtype = 'bfloat16'
    if resume == 'auto':
        from .checkpoints import find_resumable_checkpoint
        # mmengine would trust work_dir/last_checkpoint blindly; pick the newest complete one
        cfg.load_from = find_resumable_checkpoint(cfg.work_dir)  # warns when there is none
        cfg.resume = cfg.load_from is not None
    elif resume is not None:
        cfg.resume, cfg.load_from = True, resume
    if load_from is not None:
        cfg.load_from = load_from
    return cfg


def enable_visualization(cfg: Config, show_dir: Optional[str], show: bool = False,
                         wait_time: float = 2.0) -> None:
    """Draw test predictions (into ``work_dir/<timestamp>/show_dir`` for mmdet, ``show_dir`` for
    mmseg), as ``tools/test.py --show-dir`` does in mmdet and mmseg."""
    hook = cfg.default_hooks.get('visualization')
    if hook is None:
        raise RuntimeError('the config has no default_hooks.visualization; add '
                           "visualization=dict(type='DetVisualizationHook') (or SegVisualizationHook)")
    hook['draw'] = True
    if show:
        hook['show'] = True
        hook['wait_time'] = wait_time
    if show_dir:
        if task_of(cfg) == 'det':
            hook['test_out_dir'] = show_dir
        else:
            cfg.visualizer['save_dir'] = show_dir


def keep_freed_cpu_memory(trim_threshold_gb: float = 1.0) -> bool:
    """Let glibc's malloc keep freed tensor memory in the process instead of returning it.

    By default glibc serves each large allocation (a feature map: tens of MB) with a fresh
    ``mmap`` and unmaps it when freed, so every layer's output is written to new pages and pays
    a page fault per 4 KiB: on the 2-core VMs here a 3x3 depthwise conv on a 384x100x168 map took
    ~11 ms with fresh pages and ~7.5 ms on reused ones, and a demo training step ~7 % longer.
    This raises the mmap threshold to glibc's maximum (32 MiB) and keeps up to
    ``trim_threshold_gb`` of freed heap, as PyTorch's CPU tuning guide does by switching to
    jemalloc or tcmalloc. The tools call it for CPU runs; it is a no-op elsewhere (not glibc).

    Returns:
        bool: Whether the settings were applied.
    """
    if not sys.platform.startswith('linux'):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    return bool(mallopt(m_mmap_threshold, 32 * 2**20)
                and mallopt(m_trim_threshold, int(trim_threshold_gb * 2**30))
                and mallopt(m_top_pad, 64 * 2**20))
