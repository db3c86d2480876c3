"""Reading a config and building its model as mmdet's and mmseg's tools do: ``tools/train.py``,
``tools/test.py``, ONNX export (``deepvit_mm.deploy``) and the tools' measuring harness use it."""
import contextlib
import copy
import os.path as osp
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log

from ..consumers import check_model

__all__ = ['task_of', 'task_registry', 'load_config', 'build_from_config', 'num_classes_of',
           'prepare_config', 'enable_visualization', 'VIS_BACKENDS', 'set_vis_backends',
           'TTA_SCALE_RATIOS', 'enable_tta', 'build_inferencer']


def task_of(cfg: Config) -> str:
    """``'det'`` or ``'seg'``, from the config's ``default_scope`` (set by mmdet/mmseg bases)."""
    scope = cfg.get('default_scope', 'mmdet')
    if scope not in ('mmdet', 'mmseg'):
        raise ValueError(f'unsupported default_scope {scope!r}: configs must inherit an mmdet or '
                         'mmseg base (default_scope "mmdet" or "mmseg").')
    return 'det' if scope == 'mmdet' else 'seg'


def task_registry(task: str, name: str = 'MODELS'):
    """mmdet's (``task='det'``) or mmseg's (``'seg'``) registry ``name`` (``'MODELS'``,
    ``'DATASETS'``), with the library's modules registered and the default scope left as it is."""
    if task == 'seg':
        import mmseg.registry as registry
        from mmseg.utils import register_all_modules
    elif task == 'det':
        import mmdet.registry as registry
        from mmdet.utils import register_all_modules
    else:
        raise ValueError(f"task {task!r}: use 'det' or 'seg'")
    register_all_modules(init_default_scope=False)
    return getattr(registry, name)


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Read a config for building its model without its weights (to export, count or measure it):
    ``cfg_options`` merged, no weights file (``model.backbone.init_cfg`` and mmseg's
    ``model.pretrained`` cleared); a float16 ``AmpOptimWrapper`` trains in float32 without a GPU,
    as ``tools/train.py`` runs it."""
    from .amp import fit_precision_to_device
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    fit_precision_to_device(cfg)
    if cfg.model.get('backbone') is not None:
        cfg.model.backbone.init_cfg = None
    if 'pretrained' in cfg.model:
        cfg.model.pretrained = None
    return cfg


def build_from_config(cfg, cfg_options: Optional[dict] = None, *,
                      device: Optional[str] = None) -> Tuple[nn.Module, str]:
    """A config's detector or segmentor, built by mmdet's or mmseg's ``MODELS`` in the config's
    scope (the caller's default scope stays as it was), SyncBN reverted to BN (one process), its
    neck or heads checked against its columnar backbone (``deepvit_mm.consumers.check_model``).

    Args:
        cfg (str | Config): A config file (read with ``load_config``) or a loaded config.
        cfg_options (dict, optional): Overrides, as ``--cfg-options`` gives them (for a file).
        device (str, optional): ``'meta'``: every tensor on the meta device, no memory and no
            ``init_weights`` (which reads values). Default: initialised weights on the CPU.

    Returns:
        tuple[nn.Module, str]: the model and its task, ``'det'`` or ``'seg'``.

    Raises:
        ChannelMismatchError: the neck or heads were built for other channels or levels than the
            backbone feeds; the message names the config keys to set.
    """
    from mmengine.model.utils import revert_sync_batchnorm
    from mmengine.registry import DefaultScope
    if device not in (None, 'meta'):
        raise ValueError(f"device {device!r}: use None or 'meta'")
    if isinstance(cfg, str):
        cfg = load_config(cfg, cfg_options)
    task = task_of(cfg)
    models = task_registry(task)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope', 'mmdet')):
        with torch.device('meta') if device == 'meta' else contextlib.nullcontext():
            model = revert_sync_batchnorm(models.build(cfg.model))
        check_model(model)  # reads the modules' sizes only: a meta model has them too
        if device is None:
            model.init_weights()
    return model, task


def num_classes_of(model: nn.Module, task: str) -> int:
    """Classes the heads predict: the seg decode head's, the RoI box head's, or a one-stage
    head's; 80 (COCO) when none says."""
    if task == 'seg':
        return int(model.decode_head.num_classes)
    for head in (getattr(getattr(model, 'roi_head', None), 'bbox_head', None),
                 getattr(model, 'bbox_head', None)):
        if head is not None and hasattr(head, 'num_classes'):
            return int(head.num_classes)
    return 80


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

    Raises:
        ChannelMismatchError: as ``build_from_config``.
    """
    from ..checkpoints import resolve_checkpoint
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
    check_model(model)
    meta = dict(getattr(model, 'dataset_meta', None) or {})
    classes = meta.get('classes')
    if classes is None or len(classes) != num_classes_of(model, task):
        model.dataset_meta = _config_dataset_meta(cfg, task)
        inferencer.visualizer.dataset_meta = model.dataset_meta
    return inferencer, task


def _config_dataset_meta(cfg: Config, task: str) -> dict:
    """Class names and colours of the config's test dataset: the dataset's own colours for the
    classes it names, fixed random ones where it has none."""
    DATASETS = task_registry(task, 'DATASETS')
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
