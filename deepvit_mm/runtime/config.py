"""Reading a config for a run as mmdet's and mmseg's tools do: ``tools/train.py``,
``tools/test.py`` and the benchmark harness's evaluation use it."""
import os.path as osp
from typing import Optional

import torch
from mmengine.config import Config

__all__ = ['task_of', 'prepare_config', 'enable_visualization']


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
        from ..checkpoints import find_resumable_checkpoint
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
