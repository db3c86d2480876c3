"""Reading a config and building its model as mmdet's and mmseg's tools do, and the tools' flags
applied to a config: ``tools/train.py``, ``tools/test.py``, ONNX export (``deepvit_mm.deploy``)
and the tools' measuring harness use it."""
import contextlib
import copy
import importlib.util
import os.path as osp
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log

from .._deps import missing_toolbox_message
from ..models.utils.consumers import check_model
from ..utils import meta_device
from ..version import TOOLBOXES

__all__ = ['task_of', 'task_registry', 'read_config', 'load_config', 'build_from_config',
           'num_classes_of', 'prepare_config', 'set_test_out', 'enable_visualization',
           'VIS_BACKENDS', 'vis_backend_types', 'set_vis_backends', 'enable_tta']


def task_of(cfg: Config) -> str:
    """``'det'`` or ``'seg'``, from the config's ``default_scope`` (set by mmdet/mmseg bases).

    Raises:
        ValueError: a scope of neither.
        ImportError: the library of the config is not installed; the message says what to install.
    """
    scope = cfg.get('default_scope', 'mmdet')
    if scope not in ('mmdet', 'mmseg'):
        raise ValueError(f'unsupported default_scope {scope!r}: configs must inherit an mmdet or '
                         'mmseg base (default_scope "mmdet" or "mmseg").')
    _require_toolbox(scope)
    return 'det' if scope == 'mmdet' else 'seg'


def _require_toolbox(scope: str, why: Optional[str] = None) -> None:
    message = missing_toolbox_message(scope, why)
    if message:
        raise ImportError(message, name=scope)


# mmengine 0.10 finds the package of a `_base_ = 'pkg::...'` through pkg_resources (is_installed,
# get_installed_path), which setuptools 82 removed
PKG_RESOURCES_GONE = ("its _base_ names a package's config ('mmdet::...', 'mmseg::...'), which "
                      "mmengine 0.10 finds through pkg_resources, gone since setuptools 82: "
                      'pip install "setuptools<82", or name the base by its file')


def read_config(path: str) -> Config:
    """``Config.fromfile(path)``; a config of mmdet or mmseg, the one that is not installed, stops
    with what to install instead of the import error met while reading its bases (or, read, by
    its ``default_scope``); a ``pkg::`` base without ``pkg_resources`` stops with the setuptools
    to install.

    Raises:
        ImportError: as above; any other import error as mmengine raises it.
    """
    try:
        cfg = Config.fromfile(path)
    except ImportError as e:
        if e.name == 'pkg_resources':
            raise ImportError(f'{path}: {PKG_RESOURCES_GONE}', name='pkg_resources') from None
        message = None
        for pkg, toolbox in TOOLBOXES.items():
            scope = toolbox['scope']
            # mmengine's Config._get_cfg_path (0.10.3, 0.10.7) for a `_base_ = '<scope>::...'` of
            # a library that is not installed; a pure-Python config's import: ModuleNotFoundError
            if str(e).startswith(f'{pkg} is not installed'):
                message = missing_toolbox_message(scope, f'its _base_ reads {scope}::')
            elif (e.name or '').split('.')[0] == toolbox['module']:
                message = missing_toolbox_message(scope, f"it imports {toolbox['module']}")
            if message:
                break
        else:
            raise
        raise ImportError(message, name=scope) from None
    _require_toolbox(cfg.get('default_scope'))  # a scope of neither toolbox needs nothing
    return cfg


def task_registry(task: str, name: str = 'MODELS'):
    """mmdet's (``task='det'``) or mmseg's (``'seg'``) registry ``name`` (``'MODELS'``,
    ``'DATASETS'``), with the library's modules registered and the default scope left as it is.

    Raises:
        ImportError: that library is not installed; the message says what to install.
    """
    if task in ('det', 'seg'):
        _require_toolbox('mmdet' if task == 'det' else 'mmseg')
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
    from ..engine.optimizers.cpu_amp_optim_wrapper import fit_precision_to_device
    cfg = read_config(path)
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
    neck or heads checked against its columnar backbone (``deepvit_mm.models.utils.consumers.check_model``).

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
        with meta_device() if device == 'meta' else contextlib.nullcontext():
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
                   load_from: Optional[str] = None, auto_scale_lr: bool = False) -> Config:
    """Read ``config`` and apply the usual mm command-line options (as mmdet/mmseg tools do);
    ``auto_scale_lr``: ``tools/train.py --auto-scale-lr`` (``enable_auto_scale_lr``)."""
    if not osp.isfile(config):
        raise FileNotFoundError(f'config not found: {config!r}')
    cfg = read_config(config)
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
    if auto_scale_lr:
        enable_auto_scale_lr(cfg)
    return cfg


def enable_auto_scale_lr(cfg: Config) -> None:
    """Scale the lr to the batch the run trains with (``tools/train.py --auto-scale-lr``, as in
    mmdet): ``cfg.auto_scale_lr.enable = True``, and mmengine's Runner multiplies every lr by
    (processes x ``train_dataloader.batch_size``) / ``auto_scale_lr.base_batch_size`` before
    training. The recipes state their base batch (16: 8 GPUs x 2 images).

    Raises:
        ValueError: the config has no ``auto_scale_lr.base_batch_size``; the message says what to
            add.
    """
    scale = cfg.get('auto_scale_lr')
    if not isinstance(scale, dict) or 'base_batch_size' not in scale:
        raise ValueError(
            '--auto-scale-lr: the config does not say which batch its lr was set for; add '
            '`auto_scale_lr = dict(enable=False, base_batch_size=N)` to it, N = GPUs x images '
            'per GPU of that batch (e.g. 16 for 8 GPUs x 2)')
    cfg.auto_scale_lr.enable = True


def set_test_out(cfg: Config, out: Optional[str]) -> None:
    """Keep the test predictions for offline evaluation (``tools/test.py --out``), as mmdet's and
    mmseg's own ``tools/test.py --out`` do.

    mmdet configs: ``out`` is a ``.pkl``/``.pickle`` file written by mmdet's ``DumpDetResults``
    metric (masks RLE-encoded; what mmdet's ``tools/analysis_tools`` read), added after the
    config's metrics. mmseg configs: ``out`` is a folder, the test metrics' ``output_dir`` (one
    ``.png`` of class indices an image), with ``keep_results=True``.

    Args:
        cfg (Config): Changed in place.
        out (str, optional): None leaves the config as it is.

    Raises:
        ValueError: an mmdet config and ``out`` not a ``.pkl``/``.pickle`` file.
    """
    if out is None:
        return
    evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, (list, tuple)) \
        else [cfg.test_evaluator]
    if task_of(cfg) == 'det':
        if not out.endswith(('.pkl', '.pickle')):
            raise ValueError(f'--out {out!r}: for an mmdet config the predictions go to a .pkl or '
                             '.pickle file (mmseg configs take a folder)')
        cfg.test_evaluator = list(evaluators) + [dict(type='DumpDetResults', out_file_path=out)]
    else:
        for ev in evaluators:
            ev['output_dir'] = out
            ev['keep_results'] = True


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


# ``--vis-backend`` names -> mmengine's visualization backends (its VISBACKENDS registry)
VIS_BACKENDS = {'local': 'LocalVisBackend', 'tensorboard': 'TensorboardVisBackend',
                'wandb': 'WandbVisBackend', 'mlflow': 'MLflowVisBackend',
                'clearml': 'ClearMLVisBackend', 'neptune': 'NeptuneVisBackend',
                'dvclive': 'DVCLiveVisBackend', 'aim': 'AimVisBackend'}
# what each needs installed: alternatives of modules (any one will do), the pip install arguments;
# mmengine imports them only when the backend first writes, i.e. once training has started
_VIS_BACKEND_NEEDS = {
    'tensorboard': ([('tensorboard',), ('tensorboardX',)], 'tensorboard'),
    'wandb': ([('wandb',)], 'wandb'),
    'mlflow': ([('mlflow',)], 'mlflow'),
    'clearml': ([('clearml',)], 'clearml'),
    'neptune': ([('neptune',)], '-U neptune'),
    'dvclive': ([('dvclive', 'pygit2')], 'dvclive pygit2'),
    'aim': ([('aim',)], 'aim'),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def vis_backend_types(backends: Sequence[str]) -> list:
    """mmengine's backend types for ``--vis-backend`` names, in order, without repeats.

    Args:
        backends (Sequence[str]): Short names (``VIS_BACKENDS``: ``local``, ``tensorboard``,
            ``wandb``, ...; any case) or types registered in mmengine's ``VISBACKENDS``
            (``WandbVisBackend``, or a project's own).

    Returns:
        list[str]: The registry types.

    Raises:
        ValueError: a name that is neither; the message lists the names.
        ImportError: a backend whose package is not installed; the message is the
            ``pip install`` command.
    """
    from mmengine.registry import VISBACKENDS
    short = {t: n for n, t in VIS_BACKENDS.items()}
    types = []
    for name in backends:
        kind = VIS_BACKENDS.get(name.lower(), name)
        if kind not in short and VISBACKENDS.get(kind) is None:
            raise ValueError(f'unknown visualization backend {name!r}: choose from '
                             f'{", ".join(sorted(VIS_BACKENDS))} (or a type registered in '
                             "mmengine's VISBACKENDS, e.g. WandbVisBackend)")
        needs = _VIS_BACKEND_NEEDS.get(short.get(kind))
        if needs and not any(all(_installed(m) for m in alt) for alt in needs[0]):
            raise ImportError(f'--vis-backend {short[kind]} needs its package: '
                              f'pip install {needs[1]}')
        if kind not in types:
            types.append(kind)
    return types


def set_vis_backends(cfg: Config, backends: Optional[Sequence[str]]) -> None:
    """Make ``cfg.visualizer.vis_backends`` exactly ``backends`` (``tools/train.py`` and
    ``tools/test.py --vis-backend local tensorboard``): scalars (losses, learning rate, metrics)
    and drawn predictions go to each; ``local`` writes ``<work_dir>/<timestamp>/vis_data``,
    ``tensorboard`` an event file there too (``tensorboard --logdir <work_dir>``), ``wandb``,
    ``mlflow``, ``clearml``, ``neptune``, ``dvclive`` and ``aim`` to those services (each
    configured as its package says: login, environment variables).

    Args:
        cfg (Config): Changed in place.
        backends (Sequence[str], optional): Names, as ``vis_backend_types`` takes them; None or
            empty leaves the config's own.

    Raises:
        ValueError, ImportError: as ``vis_backend_types``, before anything is changed.
    """
    if not backends:
        return
    types = vis_backend_types(backends)
    if cfg.get('visualizer') is None:
        raise ValueError('the config has no `visualizer`; inherit mmdet\'s or mmseg\'s '
                         'default_runtime.py')
    cfg.visualizer['vis_backends'] = [dict(type=t) for t in types]


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
