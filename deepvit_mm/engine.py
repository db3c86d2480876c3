"""Runner-side pieces: mixed precision on CPU and the config handling shared by tools/."""
import copy
import ctypes
import ctypes.util
import os.path as osp
import sys
from contextlib import contextmanager
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from .cpu_autocast import run_mmcv_ops_in_float32
from .runtime.hooks import RNGStateHook  # noqa: F401  (its former home)

__all__ = ['CPUAmpOptimWrapper', 'RNGStateHook', 'task_of', 'prepare_config',
           'enable_visualization', 'VIS_BACKENDS', 'set_vis_backends', 'TTA_SCALE_RATIOS',
           'enable_tta', 'build_inferencer', 'keep_freed_cpu_memory']


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


# ``--vis-backend`` names -> mmengine's visualization backends
VIS_BACKENDS = {'local': 'LocalVisBackend', 'tensorboard': 'TensorboardVisBackend'}


def set_vis_backends(cfg: Config, backends: Optional[Sequence[str]]) -> None:
    """Make ``cfg.visualizer.vis_backends`` exactly ``backends`` (``tools/train.py`` and
    ``tools/test.py --vis-backend local tensorboard``): scalars (losses, learning rate, metrics)
    and drawn predictions go to each; ``local`` writes ``<work_dir>/<timestamp>/vis_data``,
    ``tensorboard`` an event file there too (``tensorboard --logdir <work_dir>``).

    Args:
        cfg (Config): Changed in place.
        backends (Sequence[str], optional): Names among ``VIS_BACKENDS``; None or empty leaves
            the config's own.
    """
    if not backends:
        return
    unknown = sorted(set(backends) - set(VIS_BACKENDS))
    if unknown:
        raise ValueError(f'unknown visualization backend(s) {unknown}: choose from '
                         f'{sorted(VIS_BACKENDS)}')
    if 'tensorboard' in backends:
        try:
            import tensorboard  # noqa: F401  (mmengine's backend imports it only when it first writes)
        except ImportError as e:
            raise ImportError('--vis-backend tensorboard needs the tensorboard package: '
                              'pip install tensorboard') from e
    if cfg.get('visualizer') is None:
        raise ValueError('the config has no `visualizer`; inherit mmdet\'s or mmseg\'s '
                         'default_runtime.py')
    cfg.visualizer['vis_backends'] = [dict(type=VIS_BACKENDS[b]) for b in dict.fromkeys(backends)]


# mmseg's ADE20k test-time scales (its _base_/datasets/ade20k.py `img_ratios`)
TTA_SCALE_RATIOS = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75)


def enable_tta(cfg: Config) -> None:
    """Evaluate with test-time augmentation (``tools/test.py --tta``), as mmdet's and mmseg's own
    ``tools/test.py --tta`` do: the model is wrapped in ``cfg.tta_model`` (mmdet's
    ``DetTTAModel``, mmseg's ``SegTTAModel``) and the test set is read through
    ``cfg.tta_pipeline``, which runs every image once per augmented view.

    The recipes define both in their bases (configs/_base_/schedules/: COCO the test scale with
    and without a horizontal flip, as mmdet's *_tta.py configs; ADE20k mmseg's six scales x flip).
    A config without them gets what mmdet's tools/test.py falls back to (``DetTTAModel``, the test
    pipeline with and without flip) or, for mmseg, ``SegTTAModel`` over its test ``Resize`` at
    ``TTA_SCALE_RATIOS`` x flip.

    mmdet 3.3's ``DetTTAModel`` merges boxes only (it refuses masks): for a model with a mask head
    the mask head is left out and only ``bbox`` is evaluated (the checkpoint's mask-head tensors
    are then reported as skipped).

    Args:
        cfg (Config): A config read by ``prepare_config``; changed in place.
    """
    task = task_of(cfg)
    if 'tta_model' not in cfg:
        print_log('--tta: the config has no tta_model; using ' +
                  ('DetTTAModel (NMS at IoU 0.5, 100 boxes), as mmdet\'s tools/test.py does'
                   if task == 'det' else 'SegTTAModel'), logger='current', level=30)
        cfg.tta_model = (dict(type='DetTTAModel', tta_cfg=dict(
            nms=dict(type='nms', iou_threshold=0.5), max_per_img=100)) if task == 'det'
                         else dict(type='SegTTAModel'))
    if 'tta_pipeline' not in cfg:
        cfg.tta_pipeline = _default_tta_pipeline(cfg, task)
        print_log('--tta: the config has no tta_pipeline; using its test pipeline with '
                  + ('and without a horizontal flip' if task == 'det' else
                     f'its Resize at scales x{list(TTA_SCALE_RATIOS)}, with and without a '
                     'horizontal flip'), logger='current', level=30)
    if task == 'det' and cfg.model.get('roi_head', {}).get('mask_head') is not None:
        print_log('--tta: mmdet\'s DetTTAModel merges boxes only; the mask head is left out '
                  '(its checkpoint tensors are skipped) and only bbox is evaluated',
                  logger='current', level=30)
        cfg.model.roi_head.mask_head = None
        cfg.model.roi_head.mask_roi_extractor = None
        evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, list) \
            else [cfg.test_evaluator]
        for ev in evaluators:
            metric = ev.get('metric')
            if isinstance(metric, (list, tuple)) and 'bbox' in metric:
                ev['metric'] = ['bbox']
            elif metric == 'segm':
                ev['metric'] = 'bbox'
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)


def _default_tta_pipeline(cfg: Config, task: str) -> list:
    data = cfg.test_dataloader.dataset
    while 'dataset' in data:  # dataset wrappers
        data = data['dataset']
    pipeline = copy.deepcopy(list(data.pipeline))
    flips = [dict(type='RandomFlip', prob=1., direction='horizontal'),
             dict(type='RandomFlip', prob=0., direction='horizontal')]
    if task == 'det':  # mmdet's tools/test.py: the last transform (packing) after both flips
        pack = dict(pipeline[-1])
        pack['meta_keys'] = tuple(pack.get('meta_keys', (
            'img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))) + (
            'flip', 'flip_direction')
        return pipeline[:-1] + [dict(type='TestTimeAug', transforms=[flips, [pack]])]
    at = next((i for i, t in enumerate(pipeline) if t['type'] == 'Resize' and 'scale' in t), None)
    if at is None:  # nothing to scale: flips only
        return pipeline[:-1] + [dict(type='TestTimeAug', transforms=[flips, [pipeline[-1]]])]
    resize = pipeline[at]
    w, h = resize['scale']
    scales = [dict(resize, scale=(round(w * r), round(h * r))) for r in TTA_SCALE_RATIOS]
    return pipeline[:at] + [dict(type='TestTimeAug',
                                 transforms=[scales, flips] + [[t] for t in pipeline[at + 1:]])]


def build_inferencer(config: str, weights: str, device: Optional[str] = None):
    """mmdet's ``DetInferencer`` or mmseg's ``MMSegInferencer`` for a config (told apart by its
    ``default_scope``), as ``demo/image_demo.py`` uses it.

    The weights are read by ``deepvit_mm.checkpoints`` (a local file, or an http(s) URL
    downloaded once to the torch hub cache). The class names drawn are the checkpoint's
    (mmengine's ``dataset_meta``, or the ``CLASSES`` of an mmdet 2.x / mmseg 0.x checkpoint, e.g.
    the official XCiT ones); where it has none, or names that do not fit the model's number of
    classes, the config dataset's (the inferencers would fall back to COCO's or Cityscapes').

    Args:
        config (str): An mmdet or mmseg config file.
        weights (str): A detector/segmentor checkpoint: a path or an http(s) URL.
        device (str, optional): Default: ``'cuda:0'`` when available, else ``'cpu'``.

    Returns:
        tuple: The inferencer and the task, ``'det'`` or ``'seg'``.
    """
    from .checkpoints import resolve_checkpoint
    if not osp.isfile(config):
        raise FileNotFoundError(f'config not found: {config!r}')
    cfg = Config.fromfile(config)
    task = task_of(cfg)
    device = device or ('cuda:0' if torch.cuda.is_available() else 'cpu')
    weights = resolve_checkpoint(weights)
    if task == 'det':
        from mmdet.apis import DetInferencer as Inferencer
    else:
        from mmseg.apis import MMSegInferencer as Inferencer
    inferencer = Inferencer(model=cfg, weights=weights, device=device)
    model = inferencer.model
    meta = dict(getattr(model, 'dataset_meta', None) or {})
    classes = meta.get('classes')
    if classes is None or len(classes) != _num_classes(model, task):
        model.dataset_meta = _config_dataset_meta(cfg, task)
        inferencer.visualizer.dataset_meta = model.dataset_meta
    return inferencer, task


def _num_classes(model: nn.Module, task: str) -> int:
    if task == 'seg':
        return int(model.decode_head.num_classes)
    head = getattr(getattr(model, 'roi_head', None), 'bbox_head', None) or model.bbox_head
    return int(head.num_classes)


def _config_dataset_meta(cfg: Config, task: str) -> dict:
    """Class names and colours of the config's test dataset: the dataset's own colours for the
    classes it names, fixed random ones where it has none."""
    if task == 'det':
        from mmdet.registry import DATASETS
        from mmdet.utils import register_all_modules
    else:
        from mmseg.registry import DATASETS
        from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    data = cfg.test_dataloader.dataset
    while 'dataset' in data:
        data = data['dataset']
    full = dict(getattr(DATASETS.get(data['type']), 'METAINFO', {}))
    given = dict(data.get('metainfo') or {})
    classes = tuple(given.get('classes', full.get('classes', ())))
    palette = given.get('palette')
    if palette is None or len(palette) != len(classes):
        names, colours = list(full.get('classes', ())), list(full.get('palette') or ())
        if len(colours) == len(names) and all(c in names for c in classes):
            palette = [tuple(colours[names.index(c)]) for c in classes]  # the dataset's colours
        else:  # the same colours every run
            palette = [tuple(int(v) for v in c)
                       for c in np.random.RandomState(0).randint(0, 256, (len(classes), 3))]
    return dict(classes=classes, palette=[tuple(c) for c in palette])


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
