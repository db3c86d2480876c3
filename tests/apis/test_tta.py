"""``tools/test.py --tta`` (mmdet's DetTTAModel, mmseg's SegTTAModel with the recipes' TTA
pipelines) and ``--vis-backend``."""
import glob
import json
import os
import re
import textwrap

import pytest
import torch
from conftest import ROOT
from mmengine.config import Config

from deepvit_mm.apis.config import TTA_SCALE_RATIOS, enable_tta, set_vis_backends

DEMO_SEG = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
DEMO_DET = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')


def _views(cfg: Config) -> list:
    """The TestTimeAug transform lists of the test pipeline."""
    (tta,) = [t for t in cfg.test_dataloader.dataset.pipeline if t['type'] == 'TestTimeAug']
    return tta['transforms']


@pytest.mark.slow
def test_ade20k_recipes_test_at_six_scales_with_and_without_flip():
    """``--tta`` on an ADE20k recipe: SegTTAModel around the model, six scales with and without
    flip. Reads the UperNet recipe through its chain of bases with mmengine."""
    cfg = Config.fromfile(os.path.join(ROOT, 'configs', 'upernet_xcit_t12_16_160k_ade20k.py'))
    backbone = cfg.model.backbone.type
    enable_tta(cfg)
    assert cfg.model.type == 'SegTTAModel' and cfg.model.module.backbone.type == backbone
    scales, flips, *_ = _views(cfg)
    assert [t['scale_factor'] for t in scales] == list(TTA_SCALE_RATIOS)
    assert sorted(t['prob'] for t in flips) == [0., 1.]


def test_coco_recipes_test_with_and_without_flip_boxes_only():
    cfg = Config.fromfile(os.path.join(ROOT, 'configs', 'mask_rcnn_cait_xxs24_3x.py'))
    enable_tta(cfg)
    assert cfg.model.type == 'DetTTAModel' and cfg.model.module.backbone.type == 'CaiT'
    assert cfg.model.tta_cfg.nms.iou_threshold == 0.5
    scales, flips, *_ = _views(cfg)
    assert [t['scale'] for t in scales] == [(1333, 800)]  # the test scale
    assert sorted(t['prob'] for t in flips) == [0., 1.]
    # mmdet 3.3's DetTTAModel refuses masks: no mask head, bbox evaluated
    assert cfg.model.module.roi_head.mask_head is None
    assert cfg.test_evaluator.metric == ['bbox']


def test_a_config_without_tta_settings_gets_the_mm_defaults():
    seg = Config.fromfile(DEMO_SEG)
    assert 'tta_pipeline' not in seg
    enable_tta(seg)
    scales, flips, *rest = _views(seg)
    assert [t['scale'] for t in scales] == [(round(1024 * r), round(256 * r))
                                           for r in TTA_SCALE_RATIOS]
    assert [t[0]['type'] for t in rest] == ['LoadAnnotations', 'PackSegInputs']
    det = Config.fromfile(DEMO_DET)
    enable_tta(det)
    flips, (pack,) = _views(det)
    assert len(flips) == 2 and pack['type'] == 'PackDetInputs' and 'flip' in pack['meta_keys']


def test_set_vis_backends():
    cfg = Config.fromfile(DEMO_SEG)
    set_vis_backends(cfg, ['tensorboard', 'local', 'tensorboard'])
    assert cfg.visualizer.vis_backends == [dict(type='TensorboardVisBackend'),
                                           dict(type='LocalVisBackend')]
    set_vis_backends(cfg, None)  # unchanged
    assert len(cfg.visualizer.vis_backends) == 2
    with pytest.raises(ValueError, match='nosuch'):  # tests/tools/test_tool_flags.py: every backend
        set_vis_backends(cfg, ['nosuch'])


# A hook that counts, per test image, the views the pipeline made and the backbone's forwards
PROBE = '''
import json, os.path as osp
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class TTAProbeHook(Hook):
    def before_test(self, runner):
        self.calls, self.views, self.images = [0], [], 0
        model = runner.model
        while hasattr(model, 'module'):
            model = model.module
        model.backbone.register_forward_hook(lambda *a: self.calls.__setitem__(0, self.calls[0] + 1))
        self.model = type(runner.model).__name__

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        # TTA batches nest the views in lists (mmdet: views of images, mmseg: images of views)
        def leaves(x):
            return [y for i in x for y in leaves(i)] if isinstance(x, (list, tuple)) else [x]
        images = {s.img_path for s in leaves(data_batch['data_samples'])}
        self.views.append(len(leaves(data_batch['inputs'])) // len(images))
        self.images += len(images)

    def after_test(self, runner):
        with open(osp.join(runner.work_dir, 'probe.json'), 'w') as f:
            json.dump(dict(model=self.model, views=self.views, images=self.images,
                           backbone_calls=self.calls[0]), f)
'''


def _run_test(in_process, monkeypatch, tmp_path, config, data_root, checkpoint, *extra):
    """tools/test.py on ``config`` (through a child config adding the probe hook), in this process
    (tests/test_one_family.py starts the tool as a process)."""
    (tmp_path / 'tta_probe.py').write_text(PROBE)
    child = tmp_path / 'probed.py'
    child.write_text(textwrap.dedent(f"""
        _base_ = '{config}'
        custom_imports = dict(imports=['deepvit_mm', 'tta_probe'], allow_failed_imports=False)
        custom_hooks = [dict(type='CheckConsumersHook'), dict(type='FiniteLossHook'),
                        dict(type='RNGStateHook'), dict(type='TTAProbeHook')]
        """))
    work = tmp_path / ('work_tta' if '--tta' in extra else 'work')
    opts = [f'test_dataloader.dataset.data_root={data_root}', 'test_dataloader.num_workers=0',
            'test_dataloader.persistent_workers=False']
    if config == DEMO_DET:
        ann = os.path.join(data_root, 'annotations', 'instances_val.json')
        opts.append(f'test_evaluator.ann_file={ann}')
    monkeypatch.syspath_prepend(str(tmp_path))  # the probe's module, for custom_imports
    run = in_process(os.path.join(ROOT, 'tools', 'test.py'), str(child), str(checkpoint),
                     '--work-dir', str(work), *extra, '--cfg-options', *opts, cwd=str(tmp_path))
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    return log, json.loads((work / 'probe.json').read_text()), work


def _checkpoint(config, path):
    from deepvit_mm.apis import build_from_config
    model, _ = build_from_config(config)
    torch.save({'state_dict': model.state_dict()}, str(path))


@pytest.mark.slow
def test_tools_test_tta_on_the_demo_segmentor(tmp_path, in_process, monkeypatch):
    """12 views an image (6 scales x flip), 12 backbone forwards an image, SegTTAModel merging,
    an mIoU; without --tta one view and one forward. --vis-backend writes TensorBoard events."""
    from deepvit_tools.demo_data import make_ade_demo
    data = tmp_path / 'ade'
    make_ade_demo(str(data), num_train=1, num_val=2, size=128, seed=3)
    _checkpoint(DEMO_SEG, tmp_path / 'seg.pth')
    log, probe, work = _run_test(in_process, monkeypatch, tmp_path, DEMO_SEG, data,
                                 tmp_path / 'seg.pth', '--tta', '--vis-backend', 'tensorboard')
    assert probe == dict(model='SegTTAModel', views=[12, 12], images=2, backbone_calls=24)
    assert re.search(r'mIoU: \d+\.\d+', log), log[-3000:]
    assert glob.glob(str(work / '*' / 'vis_data' / 'events.out.tfevents.*'))
    log, probe, _ = _run_test(in_process, monkeypatch, tmp_path, DEMO_SEG, data, tmp_path / 'seg.pth')
    assert probe == dict(model='EncoderDecoder', views=[1, 1], images=2, backbone_calls=2)
    assert re.search(r'mIoU: \d+\.\d+', log), log[-3000:]


@pytest.mark.slow
def test_tools_test_tta_on_the_demo_detector(tmp_path, in_process, monkeypatch):
    """2 views an image (flip), DetTTAModel merging the boxes, a bbox mAP; the mask head left
    out (its tensors skipped, nothing left at init)."""
    from deepvit_tools.demo_data import make_shapes_coco
    data = tmp_path / 'shapes'
    make_shapes_coco(str(data), num_train=1, num_val=2, size=128, seed=3)
    _checkpoint(DEMO_DET, tmp_path / 'det.pth')
    log, probe, _ = _run_test(in_process, monkeypatch, tmp_path, DEMO_DET, data,
                              tmp_path / 'det.pth', '--tta')
    assert probe['model'] == 'DetTTAModel' and probe['views'] == [2] and probe['images'] == 2
    assert probe['backbone_calls'] == 2  # each view a batch of both images
    assert re.search(r'bbox_mAP: -?\d+\.\d+', log), log[-3000:]
    assert 'segm_mAP' not in log and 'left at init' not in log
    assert re.search(r'skipped \(8\): roi_head.mask_head', log), log[-3000:]
