"""mmdet's and mmseg's command-line flags in this repo's tools, as their own tools define them.

* ``tools/train.py --auto-scale-lr``: the Runner scales the lr to the batch; every recipe states
  the batch its lr was set for;
* ``tools/test.py --out``: mmdet's results pickle (``DumpDetResults``), read by mmdet's
  ``tools/analysis_tools/confusion_matrix.py``; mmseg's prediction folder;
* ``--vis-backend``: any of mmengine's backends by name, a missing package named before training;
* ``demo/image_demo.py``: mmdet 3.3's flags (``model`` a config or a model name, ``--weights``,
  ``--pred-score-thr`` and its former name ``--score-thr``, ``--batch-size``, ``--no-save-vis``,
  ``--no-save-pred``, ``--print-result``, ``--palette``).
"""
import functools
import glob
import importlib.util
import json
import os
import pickle

import pytest
import torch
from conftest import ROOT
from mmengine.config import Config

import deepvit_mm.apis.config as apis_config
from deepvit_mm.apis import (
    PALETTES,
    prepare_config,
    resolve_model,
    set_test_out,
    set_vis_backends,
    vis_backend_types,
)

RECIPES = sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py')))
DEMO_DET = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
DEMO_SEG = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
MMDET_TOOLS = os.path.join(os.path.dirname(importlib.util.find_spec('mmdet').origin), '.mim',
                           'tools')


def _checkpoint(config: str, path) -> None:
    """A checkpoint of ``config``'s model with random weights, no class names."""
    from deepvit_mm.apis import build_from_config
    model, _ = build_from_config(config)
    torch.save({'state_dict': model.state_dict()}, str(path))


# ------------------------------------------------------------------------------ --auto-scale-lr
def _runner_lrs(tmp_path, **kwargs) -> list:
    """The optimizer's lrs after mmengine's Runner has scaled them, as ``runner.train()`` does."""
    from mmengine.runner import Runner
    cfg = prepare_config(DEMO_SEG, work_dir=str(tmp_path), **kwargs)
    runner = Runner.from_cfg(cfg)
    optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.scale_lr(optim_wrapper, runner.auto_scale_lr)
    return sorted({group['lr'] for group in optim_wrapper.optimizer.param_groups})


@pytest.mark.slow
def test_auto_scale_lr_scales_the_runner_lr_to_the_batch(tmp_path):
    """mmengine's Runner scales the lr to the batch with --auto-scale-lr only. ~2-4 s: two Runners
    built."""
    cfg = Config.fromfile(DEMO_SEG)
    lr, base = cfg.optim_wrapper.optimizer.lr, cfg.auto_scale_lr.base_batch_size
    half = {'train_dataloader.batch_size': base // 2}
    assert _runner_lrs(tmp_path / 'off', cfg_options=half) == [lr]  # the flag off: as written
    assert _runner_lrs(tmp_path / 'on', cfg_options=half, auto_scale_lr=True) == [lr / 2]


def test_auto_scale_lr_without_a_base_batch_says_what_to_add(tmp_path, in_process):
    """--auto-scale-lr on a config without a base batch: what to add, from prepare_config and from
    tools/train.py (in this process: its start as one is tested elsewhere), in one line."""
    config = tmp_path / 'no_base.py'
    config.write_text(f"_base_ = '{DEMO_SEG}'\nauto_scale_lr = dict(_delete_=True, enable=False)\n")
    with pytest.raises(ValueError, match=r'auto_scale_lr = dict\(enable=False, base_batch_size=N\)'):
        prepare_config(str(config), auto_scale_lr=True)
    run = in_process(os.path.join(ROOT, 'tools', 'train.py'), config, '--auto-scale-lr',
                     '--work-dir', tmp_path / 'work', cwd=tmp_path)
    assert run.returncode == 1 and 'Traceback' not in run.stderr, run.stderr[-3000:]
    assert 'base_batch_size=N' in run.stderr.splitlines()[-1]


@pytest.mark.parametrize('recipe', RECIPES, ids=lambda p: os.path.basename(p)[:-3])
@pytest.mark.slow
def test_every_recipe_states_its_base_batch(recipe):
    """Mask R-CNN 3x (COCO) and UperNet / Semantic FPN (ADE20k): 8 GPUs x 2 images; ViTDet's
    Mask R-CNN: 16 GPUs x 4 images, as written."""
    cfg = Config.fromfile(recipe)
    gpus, images = (16, 4) if 'vitdet' in os.path.basename(recipe) else (8, 2)
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=gpus * images)
    assert cfg.train_dataloader.batch_size == images


# ------------------------------------------------------------------------------ metrics
@pytest.mark.slow
def test_tools_test_gives_the_miou_of_a_known_prediction(tmp_path, in_process):
    """tools/test.py on a segmentor that predicts the first class everywhere: its mIoU and aAcc
    follow from the label maps alone. ~2 s: the test loop in this process."""
    import numpy as np
    from mmengine.registry import DefaultScope
    from mmseg.registry import DATASETS

    from deepvit_mm.apis import build_from_config
    from deepvit_tools.demo_data import make_ade_demo
    data = tmp_path / 'ade'
    make_ade_demo(str(data), num_train=1, num_val=2, size=128, seed=5)
    model, _ = build_from_config(DEMO_SEG)
    conv = model.decode_head.conv_seg
    with torch.no_grad():
        conv.weight.zero_()
        conv.bias.copy_(torch.tensor([5.0, 0, 0, 0, 0]))
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), tmp_path / 'model.pth')
    options = [f'test_dataloader.dataset.data_root={data}', 'test_dataloader.num_workers=0',
               'test_dataloader.persistent_workers=False']
    run = in_process(os.path.join(ROOT, 'tools', 'test.py'), DEMO_SEG, tmp_path / 'model.pth',
                     '--work-dir', tmp_path / 'work', '--cfg-options', *options, cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    (logged,) = glob.glob(str(tmp_path / 'work' / '*' / '*.json'))
    with open(logged) as f:
        metrics = json.load(f)
    cfg = Config.fromfile(DEMO_SEG)
    cfg.merge_from_dict({'test_dataloader.dataset.data_root': str(data)})
    with DefaultScope.overwrite_default_scope('mmseg'):
        dataset = DATASETS.build(cfg.test_dataloader.dataset)
    gt = np.concatenate([dataset[i]['data_samples'].gt_sem_seg.data.numpy().ravel()
                         for i in range(len(dataset))])
    gt = gt[gt != 255]
    counts = np.bincount(gt, minlength=5)
    # IoU of class 0: its pixels over all valid pixels; the others present: 0; absent: left out
    ious = [counts[0] / len(gt)] + [0.0] * int((counts[1:] > 0).sum())
    assert metrics['aAcc'] == pytest.approx(100 * counts[0] / len(gt), abs=0.01)
    assert metrics['mIoU'] == pytest.approx(100 * np.mean(ious), abs=0.01)


# ------------------------------------------------------------------------------ --out
@pytest.mark.slow
def test_tools_test_out_writes_mmdets_pickle_for_its_confusion_matrix(tmp_path, shapes,
                                                                      in_process):
    """tools/test.py --out, then mmdet's confusion_matrix.py on its pickle, both in this process
    (other tests start tools/test.py as a process). ~5 s: a test loop and the plot."""
    _checkpoint(DEMO_DET, tmp_path / 'det.pth')
    opts = [f'test_dataloader.dataset.data_root={shapes}', 'test_dataloader.num_workers=0',
            'test_dataloader.persistent_workers=False',
            f'test_evaluator.ann_file={os.path.join(shapes, "annotations", "instances_val.json")}']
    out = tmp_path / 'preds.pkl'
    run = in_process(os.path.join(ROOT, 'tools', 'test.py'), DEMO_DET, tmp_path / 'det.pth',
                     '--out', out, '--work-dir', tmp_path / 'work', '--cfg-options', *opts,
                     cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    with open(out, 'rb') as f:
        preds = pickle.load(f)
    assert len(preds) == 2 and all('pred_instances' in p and 'img_id' in p for p in preds)
    assert all('gt_instances' not in p for p in preds)  # DumpDetResults drops the ground truth
    run = in_process(os.path.join(MMDET_TOOLS, 'analysis_tools', 'confusion_matrix.py'), DEMO_DET,
                     out, tmp_path / 'cm', '--cfg-options', opts[0], cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert (tmp_path / 'cm' / 'confusion_matrix.png').is_file()


@pytest.mark.slow
def test_out_is_mmdets_pickle_or_mmsegs_folder(tmp_path):
    """``--out``: a .pkl dumped after mmdet's metrics (anything else refused), mmseg's metric output
    folder. Reads both demo configs through their chains of bases with mmengine."""
    det = Config.fromfile(DEMO_DET)
    with pytest.raises(ValueError, match=r'\.pkl or \.pickle'):
        set_test_out(det, str(tmp_path / 'preds'))
    set_test_out(det, 'preds.pkl')
    assert det.test_evaluator[0]['type'] == 'CocoMetric'  # its metrics stay, the dump comes last
    assert det.test_evaluator[-1] == dict(type='DumpDetResults', out_file_path='preds.pkl')
    seg = Config.fromfile(DEMO_SEG)  # mmseg 1.2.2's tools/test.py: the metric's output_dir
    set_test_out(seg, 'pred_dir')
    assert seg.test_evaluator.output_dir == 'pred_dir' and seg.test_evaluator.keep_results
    set_test_out(seg, None)
    assert seg.test_evaluator.output_dir == 'pred_dir'


# ------------------------------------------------------------------------------ --vis-backend
def test_vis_backends_by_name(monkeypatch):
    monkeypatch.setattr(apis_config, '_installed', lambda module: True)
    assert vis_backend_types(['local', 'WANDB', 'MLflowVisBackend', 'neptune', 'clearml',
                              'dvclive', 'aim', 'tensorboard', 'local']) == [
        'LocalVisBackend', 'WandbVisBackend', 'MLflowVisBackend', 'NeptuneVisBackend',
        'ClearMLVisBackend', 'DVCLiveVisBackend', 'AimVisBackend', 'TensorboardVisBackend']
    cfg = Config.fromfile(DEMO_SEG)
    set_vis_backends(cfg, ['wandb'])
    assert cfg.visualizer.vis_backends == [dict(type='WandbVisBackend')]


def test_an_unknown_vis_backend_is_refused_with_the_names():
    with pytest.raises(ValueError, match='unknown visualization backend .nosuch.: choose from '
                                         'aim, clearml, dvclive, local, mlflow, neptune, '
                                         'tensorboard, wandb'):
        vis_backend_types(['local', 'nosuch'])


def test_a_vis_backend_without_its_package_names_the_pip_install(monkeypatch, tmp_path,
                                                                 in_process):
    """tools/train.py --vis-backend wandb without wandb (in this process, which cannot find it
    here even where it is installed): one line naming the pip install, before the run begins."""
    monkeypatch.setattr(apis_config, '_installed', lambda module: module != 'wandb')
    cfg = Config.fromfile(DEMO_SEG)
    before = list(cfg.visualizer.vis_backends)
    with pytest.raises(ImportError, match='pip install wandb'):
        set_vis_backends(cfg, ['local', 'wandb'])
    assert cfg.visualizer.vis_backends == before  # nothing changed
    run = in_process(os.path.join(ROOT, 'tools', 'train.py'), DEMO_SEG, '--vis-backend', 'wandb',
                     '--work-dir', tmp_path / 'work', cwd=tmp_path)
    assert run.returncode == 1 and 'Traceback' not in run.stderr, run.stderr[-3000:]
    assert run.stderr.splitlines()[-1] == '--vis-backend wandb needs its package: pip install wandb'
    assert not (tmp_path / 'work').exists()  # refused before the run began


# ------------------------------------------------------------------------------ image demo
@pytest.fixture
def demo(in_process):
    """``demo/image_demo.py`` run in this process (test_zoo starts it as a process)."""
    return functools.partial(in_process, os.path.join(ROOT, 'demo', 'image_demo.py'))


@pytest.mark.slow
def test_image_demo_takes_mmdets_flags(tmp_path, demo):
    """A detector, random weights: a folder of images in batches of 2, predictions saved and
    printed without drawings; then drawings without predictions (``--score-thr``, deprecated);
    then nothing saved."""
    from deepvit_tools.demo_data import make_shapes_coco
    make_shapes_coco(str(tmp_path / 'data'), num_train=1, num_val=2, size=128, seed=1)
    images = tmp_path / 'data' / 'val'
    names = sorted(os.listdir(images))
    _checkpoint(DEMO_DET, tmp_path / 'det.pth')
    weights = ['--weights', tmp_path / 'det.pth', '--device', 'cpu']
    run = demo(images, DEMO_DET, *weights, '--out-dir', tmp_path / 'a', '--pred-score-thr', '0',
                '--batch-size', '2', '--no-save-vis', '--print-result', '--palette', 'random',
                cwd=tmp_path)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert not (tmp_path / 'a' / 'vis').exists()
    for name in names:
        pred = json.loads((tmp_path / 'a' / 'preds' / (os.path.splitext(name)[0] + '.json'))
                          .read_text())
        assert len(pred['bboxes']) == len(pred['scores']) > 0  # score threshold 0: every box
    assert "'predictions'" in run.stdout and 'results have been saved at' in run.stdout
    run = demo(images / names[0], DEMO_DET, *weights, '--out-dir', tmp_path / 'b', '--score-thr',
                '0', '--no-save-pred', cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert '--score-thr is deprecated: use --pred-score-thr' in run.stderr
    assert (tmp_path / 'b' / 'vis' / names[0]).is_file() and not (tmp_path / 'b' / 'preds').exists()
    run = demo(images / names[0], DEMO_DET, *weights, '--out-dir', tmp_path / 'c',
                '--no-save-vis', '--no-save-pred', cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert not (tmp_path / 'c').exists()


@pytest.mark.slow
def test_image_demo_segmentor_flags(tmp_path, demo):
    """demo/image_demo.py's segmentor flags (in this process). ~1-5 s: a segmentor built and run."""
    from deepvit_tools.demo_data import make_ade_demo
    make_ade_demo(str(tmp_path / 'data'), num_train=1, num_val=1, size=128, seed=1)
    (image,) = glob.glob(str(tmp_path / 'data' / 'images' / 'validation' / '*.jpg'))
    _checkpoint(DEMO_SEG, tmp_path / 'seg.pth')
    run = demo(image, DEMO_SEG, '--weights', tmp_path / 'seg.pth', '--out-dir', tmp_path / 'out',
                '--no-save-pred', '--palette', 'citys', '--print-result', cwd=tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert (tmp_path / 'out' / 'vis' / os.path.basename(image)).is_file()
    assert not (tmp_path / 'out' / 'pred').exists() and "'predictions'" in run.stdout


def test_image_demo_models_by_name():
    config, weights = resolve_model('mask_rcnn_xcit_s12_16_3x')
    assert config == os.path.join(ROOT, 'configs', 'mask_rcnn_xcit_s12_16_3x.py')
    assert weights == 'https://dl.fbaipublicfiles.com/xcit/coco/maskrcnn_xcit_small_12_p16.pth'
    assert resolve_model('mask_rcnn_xcit_s12_16_3x', 'mine.pth') == (config, 'mine.pth')
    assert resolve_model(DEMO_DET, 'mine.pth') == (DEMO_DET, 'mine.pth')
    with pytest.raises(FileNotFoundError, match='give a checkpoint with --weights'):
        resolve_model('mask_rcnn_xcit_t12_16_psne_3x')  # no released weights
    with pytest.raises(FileNotFoundError, match='neither a config file nor a model'):
        resolve_model('rtmdet-s')


def test_image_demo_refuses_what_it_cannot_do(tmp_path, demo):
    run = demo('x.jpg', DEMO_DET, '--weights', 'w.pth', '--texts', 'bench . car', cwd=tmp_path)
    assert run.returncode == 2 and 'GLIP and Grounding DINO' in run.stderr
    run = demo('x.jpg', 'mask_rcnn_xcit_t12_16_psne_3x', cwd=tmp_path)
    assert run.returncode == 1 and 'Traceback' not in run.stderr
    assert 'give a checkpoint with --weights' in run.stderr
    with open(os.path.join(ROOT, 'demo', 'image_demo.py')) as f:
        assert f"PALETTES = {PALETTES!r}" in f.read()  # the demo's --palette choices
