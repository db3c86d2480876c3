"""Peak host memory of one training step of a detector or segmentor config (CPU).

Builds the config's model and optimizer wrapper as mmengine's Runner would (no weights loaded,
SyncBN reverted to BN as in any single-process run), makes a synthetic batch of the requested
size (random images; for detectors random boxes and masks, for segmentors random label maps),
runs ``model.train_step`` once (forward, backward, optimizer step with its state) and reads the
process's peak resident set size (``getrusage``). Meant to be run in a fresh process per
measurement (``tools/memory_train_step.py`` does), since the peak of a process never goes down.
"""
import gc
import resource
import sys
import time
from typing import Dict, Optional

import torch
from mmengine.config import Config
from mmengine.model.utils import revert_sync_batchnorm
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

from .engine import task_of

__all__ = ['peak_rss_mib', 'measure_train_step']


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2 ** 20 if sys.platform == 'darwin' else peak / 2 ** 10  # bytes vs KiB


def _current_rss_mib() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20


def _batch(task: str, batch_size: int, height: int, width: int, num_objects: int,
           num_classes: int) -> dict:
    if task == 'det':
        from mmdet.testing import demo_mm_inputs
        return demo_mm_inputs(batch_size=batch_size, image_shapes=[(3, height, width)] * batch_size,
                              num_items=[num_objects] * batch_size, num_classes=num_classes,
                              with_mask=True)
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    inputs, samples = [], []
    for _ in range(batch_size):
        inputs.append(torch.randint(0, 256, (3, height, width), dtype=torch.uint8))
        s = SegDataSample(gt_sem_seg=PixelData(
            data=torch.randint(0, num_classes, (1, height, width))))
        s.set_metainfo(dict(img_shape=(height, width), ori_shape=(height, width),
                            pad_shape=(height, width)))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def measure_train_step(config: str, *, with_cp: Optional[bool] = None, batch_size: int = 1,
                       height: int = 800, width: int = 1344, num_objects: int = 10,
                       cfg_options: Optional[dict] = None, seed: int = 0) -> Dict[str, float]:
    """Run one training step of ``config`` on a synthetic batch and report memory and time.

    Args:
        config (str): An mmdet or mmseg config with a deepvit_mm backbone.
        with_cp (bool, optional): Override ``model.backbone.with_cp``. Default: the config's.
        batch_size (int): Images in the batch. Default: 1.
        height (int): Image height. Default: 800.
        width (int): Image width. Default: 1344.
        num_objects (int): Ground-truth instances per image (detectors). Default: 10.
        cfg_options (dict, optional): More config overrides.
        seed (int): Seed of the weights and the RoI sampling (same loss with and without
            checkpointing). Default: 0.

    Returns:
        dict: ``peak_rss_mib`` (whole process), ``before_step_mib`` (model, optimizer and batch
        built), ``step_peak_mib`` (their difference: what the step itself needs),
        ``step_seconds``, ``loss`` and the settings measured.
    """
    import deepvit_mm  # noqa: F401  (registers everything)

    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if with_cp is not None:
        cfg.model.backbone.with_cp = with_cp
    cfg.model.backbone.init_cfg = None  # memory does not depend on the weights
    task = task_of(cfg)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    if task == 'det':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    if task == 'seg':
        cfg.model.pop('pretrained', None)
    torch.manual_seed(seed)
    model = revert_sync_batchnorm(MODELS.build(cfg.model))
    model.init_weights()
    model.train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    num_classes = 80 if task == 'det' else 150
    head = cfg.model.get('roi_head', {}).get('bbox_head') or cfg.model.get('decode_head') or {}
    num_classes = head.get('num_classes', num_classes)
    data = _batch(task, batch_size, height, width, num_objects, num_classes)
    gc.collect()
    torch.manual_seed(seed)
    before = _current_rss_mib()
    t0 = time.perf_counter()
    log_vars = model.train_step(data, optim_wrapper)
    seconds = time.perf_counter() - t0
    peak = peak_rss_mib()
    return dict(with_cp=bool(cfg.model.backbone.get('with_cp', False)), batch_size=batch_size,
                height=height, width=width, peak_rss_mib=round(peak, 1),
                before_step_mib=round(before, 1), step_peak_mib=round(peak - before, 1),
                step_seconds=round(seconds, 1), loss=float(log_vars['loss']),
                threads=torch.get_num_threads())
