"""What ``demo/image_demo.py`` calls to draw a model's predictions, as mmdet's and mmseg's demos do.

A model of this repo's model zoo by name (``model_index``, ``resolve_model``), and mmdet's or
mmseg's inferencer for a config (``build_inferencer``: how every tool builds a config's model,
``run_inferencer``)."""
import os.path as osp
from typing import Optional, Tuple

import numpy as np
import torch
from mmengine.config import Config

from ..models.utils.consumers import check_model
from .config import num_classes_of, read_config, task_of, task_registry

__all__ = ['resolve_model', 'PALETTES', 'default_device', 'build_inferencer',
           'run_inferencer']


def model_index() -> dict:
    """The models of this repo's ``model-index.yml`` (its metafiles), by name: each
    ``dict(config=<absolute path>, weights=<URL or None>)``. The index is the source tree's, or
    the installed package's ``.mim`` copy; empty when there is neither."""
    import yaml
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    for index in (osp.join(osp.dirname(package), 'model-index.yml'),
                  osp.join(package, '.mim', 'model-index.yml')):
        if osp.isfile(index):
            break
    else:
        return {}
    root = osp.dirname(index)
    with open(index) as f:
        imports = yaml.safe_load(f).get('Import', [])
    models = {}
    for rel in imports:
        with open(osp.join(root, rel)) as f:
            for m in yaml.safe_load(f).get('Models', []):
                models[m['Name']] = dict(config=osp.join(root, m['Config']),
                                         weights=m.get('Weights'))
    return models


def resolve_model(model: str, weights: Optional[str] = None) -> Tuple[str, str]:
    """A config file and its weights from ``demo/image_demo.py``'s ``model`` and ``--weights``,
    as mmdet's ``demo/image_demo.py`` takes them: ``model`` a config file or a model name of
    ``model-index.yml`` (e.g. ``mask_rcnn_xcit_s12_16_3x``), whose released weights are taken
    when ``weights`` is None.

    Returns:
        tuple[str, str]: The config file and the weights (a path or an http(s) URL).

    Raises:
        FileNotFoundError: ``model`` is neither; or no weights: none given and none released.
    """
    if model.endswith(('.pth', '.safetensors')):
        raise FileNotFoundError(f'{model!r} is a checkpoint: give the config as the model and the '
                                'checkpoint as --weights')
    if osp.isfile(model):
        config, released = model, None
    else:
        zoo = model_index()
        if model not in zoo:
            raise FileNotFoundError(f'{model!r} is neither a config file nor a model of '
                                    f'model-index.yml ({", ".join(sorted(zoo)) or "none found"})')
        config, released = zoo[model]['config'], zoo[model]['weights']
    weights = weights or released
    if not weights:
        raise FileNotFoundError(f'no weights for {model!r}: give a checkpoint with --weights' +
                                (' (the papers released none for this model)'
                                 if not osp.isfile(model) else ''))
    return config, weights


def default_device(device: Optional[str] = None) -> str:
    """``device``, else the tools' default: ``'cuda:0'`` when available, else ``'cpu'``."""
    return device or ('cuda:0' if torch.cuda.is_available() else 'cpu')


# ``--palette`` names of mmdet's demo/image_demo.py ('none': the checkpoint's or dataset's)
PALETTES = ('coco', 'voc', 'citys', 'random', 'none')


def build_inferencer(config: str, weights: Optional[str], device: Optional[str] = None,
                     palette: str = 'none', cfg_options: Optional[dict] = None):
    """mmdet's ``DetInferencer`` or mmseg's ``MMSegInferencer`` for a config (told apart by its
    ``default_scope``): how ``demo/image_demo.py`` and the visualization tools build a model.

    The weights are read by ``deepvit_mm.checkpoints`` (a local file, or an http(s) URL
    downloaded once to the torch hub cache). The class names drawn are the checkpoint's
    (mmengine's ``dataset_meta``, or the ``CLASSES`` of an mmdet 2.x / mmseg 0.x checkpoint, e.g.
    the official XCiT ones); where it has none, or names that do not fit the model's number of
    classes, the config dataset's (the inferencers would fall back to COCO's or Cityscapes').
    ``palette`` picks the colours as mmdet's ``--palette`` does: a dataset's (COCO, VOC,
    Cityscapes; for a segmentor mmseg's COCO-Stuff, VOC, Cityscapes colours, fixed random ones past
    their number), fixed random ones, or (``'none'``) the checkpoint's or the dataset's.

    Args:
        config (str): An mmdet or mmseg config file.
        weights (str, optional): A detector/segmentor checkpoint: a path or an http(s) URL. None:
            the model's initial weights (tests).
        device (str, optional): Default: ``default_device()``.
        palette (str): The colours drawn, one of ``PALETTES``. Default: ``'none'``.
        cfg_options (dict, optional): Overrides merged into the config (``--cfg-options``).

    Returns:
        tuple: The inferencer (its ``cfg``: the config with ``cfg_options``; its visualizer
        without the config's backends) and the task, ``'det'`` or ``'seg'``.

    Raises:
        FileNotFoundError: no config file, or no checkpoint file.
        ChannelMismatchError: as ``build_from_config``.
    """
    from ..checkpoints import resolve_checkpoint
    if not osp.isfile(config):
        raise FileNotFoundError(f'config not found: {config!r}')
    if palette not in PALETTES:
        raise ValueError(f'palette {palette!r}: choose from {", ".join(PALETTES)}')
    cfg = read_config(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    task = task_of(cfg)
    weights = resolve_checkpoint(weights) if weights is not None else None
    if task == 'det':
        from mmdet.apis import DetInferencer as Inferencer
    else:
        from mmseg.apis import MMSegInferencer as Inferencer
    built = cfg.copy()
    if cfg.get('visualizer') is not None:  # its backends need a save_dir: they would only warn
        built.visualizer = dict(cfg.visualizer, vis_backends=[])
    inferencer = Inferencer(model=built, weights=weights, device=default_device(device))
    inferencer.cfg = cfg  # the backends kept: the visualization tools write through them
    model = inferencer.model
    check_model(model)
    meta = _drawing_meta(model, cfg, task, palette)
    # both visualizers draw with their own copy (mmseg's would otherwise draw Cityscapes' names)
    model.dataset_meta = inferencer.visualizer.dataset_meta = meta
    return inferencer, task


def _drawing_meta(model, cfg, task: str, palette: str) -> dict:
    """The class names and colours ``build_inferencer`` draws with (its docstring says which)."""
    meta = dict(getattr(model, 'dataset_meta', None) or {})
    classes = meta.get('classes')
    if classes is None or len(classes) != num_classes_of(model, task):
        meta = _config_dataset_meta(cfg, task)
    colours = meta.get('palette')
    if palette == 'none' and not (isinstance(colours, str) or
                                  (colours is not None and len(colours) >= len(meta['classes']))):
        own = _config_dataset_meta(cfg, task)['palette']  # e.g. a checkpoint without PALETTE
        meta['palette'] = own if len(own) == len(meta['classes']) else None
        palette = 'none' if meta['palette'] else 'random'
    if palette != 'none':  # mmdet's visualizer takes the names; mmseg's wants the colours
        meta['palette'] = palette if task == 'det' else _seg_palette(palette, len(meta['classes']))
    return meta


def _seg_palette(name: str, num_classes: int) -> list:
    """``num_classes`` colours of a ``PALETTES`` name for mmseg's visualizer."""
    from mmseg.utils import get_palette
    given = [] if name == 'random' else get_palette(
        {'coco': 'cocostuff', 'voc': 'voc', 'citys': 'cityscapes'}[name])
    state = np.random.RandomState(42)  # mmdet's fixed random colours
    extra = state.randint(0, 256, (max(num_classes - len(given), 0), 3))
    return [tuple(int(v) for v in c) for c in list(given)[:num_classes] + list(extra)]


def run_inferencer(inferencer, task: str, inputs, *, out_dir: str = 'outputs',
                   pred_score_thr: float = 0.3, batch_size: int = 1, show: bool = False,
                   no_save_vis: bool = False, no_save_pred: bool = False,
                   print_result: bool = False) -> dict:
    """Predict, draw and save as mmdet's ``demo/image_demo.py`` does, for a detector or a
    segmentor (``build_inferencer``).

    Writes ``out_dir/vis/<image name>`` (the drawings) and the predictions: detection
    ``out_dir/preds/<image stem>.json``, segmentation ``out_dir/pred/<n>_pred.png`` (class
    indices, numbered in input order).

    Args:
        inferencer: From ``build_inferencer``.
        task (str): ``'det'`` or ``'seg'``.
        inputs (str | list): An image, a folder of images, or a list of them.
        out_dir (str): ``''``: nothing saved.
        pred_score_thr (float): Detection: boxes scoring at least this are drawn.
        batch_size (int): Images an inference batch.
        show (bool): Also show each drawing in a window.
        no_save_vis (bool): Save no drawing.
        no_save_pred (bool): Save no prediction file.
        print_result (bool): Print the predictions.

    Returns:
        dict: The inferencer's results (``predictions``, ``visualization``).
    """
    if no_save_vis and no_save_pred:
        out_dir = ''
    if task == 'det':
        return inferencer(inputs, batch_size=batch_size, out_dir=out_dir,
                          pred_score_thr=pred_score_thr, show=show, no_save_vis=no_save_vis,
                          no_save_pred=no_save_pred, print_result=print_result)
    from mmengine.infer import BaseInferencer
    # MMSegInferencer.__call__ saves both or neither: its base call takes each folder
    results = BaseInferencer.__call__(
        inferencer, inputs, batch_size=batch_size, show=show,
        img_out_dir='' if no_save_vis or not out_dir else osp.join(out_dir, 'vis'),
        pred_out_dir='' if no_save_pred or not out_dir else osp.join(out_dir, 'pred'))
    if print_result:
        print(results)
    return results


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
