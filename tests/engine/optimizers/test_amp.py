"""--amp: bfloat16 autocast on CPU through mmengine's optimizer wrapper (float16 AmpOptimWrapper on
GPU), mmcv's float32-only ops under it, and a few bf16 training iterations of the demo model."""
import glob
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import DEMO_DET, ROOT, build_model
from mmcv.ops import RoIAlign, nms
from mmengine.config import Config

from deepvit_mm.apis import prepare_config
from deepvit_mm.engine import CPUAmpOptimWrapper

CFG = DEMO_DET


def _wrapper(model):
    return CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.numerics
def test_mmcv_ops_take_bfloat16_under_cpu_autocast():
    feats = torch.randn(1, 8, 16, 16, requires_grad=True)
    rois = torch.tensor([[0., 1., 1., 9., 12.], [0., 4., 2., 15., 8.]])
    conv = torch.nn.Conv2d(8, 8, 1)
    ow = _wrapper(conv)
    roi_align = RoIAlign(output_size=4, spatial_scale=1., sampling_ratio=2)
    with ow.optim_context(conv):
        x = conv(feats)
        assert x.dtype == torch.bfloat16  # autocast is on
        out = roi_align(x, rois)
        # what a half-precision kernel returns: the features' dtype (mmdet writes it into a
        # tensor of that dtype)
        assert out.dtype == torch.bfloat16
        boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [20., 20., 30., 30.]])
        scores = torch.tensor([0.9, 0.8, 0.7]).to(torch.bfloat16)
        dets, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2] and dets.dtype == torch.float32  # boxes keep their precision
    out.float().sum().backward()
    ref_feats = feats.detach().clone().requires_grad_()
    roi_align(conv(ref_feats), rois).sum().backward()
    torch.testing.assert_close(feats.grad, ref_feats.grad, rtol=0.05, atol=0.05)
    # without autocast the ops are untouched
    assert roi_align(conv(feats), rois).dtype == torch.float32


@pytest.mark.slow
def test_amp_picks_the_wrapper_for_the_device(monkeypatch):
    """``--amp``: bfloat16 CPUAmpOptimWrapper without a GPU, float16 AmpOptimWrapper (dynamic loss
    scale) with one. Reads the demo detector's config through its bases three times."""
    cpu = prepare_config(CFG, amp=True)
    assert cpu.optim_wrapper.type == 'CPUAmpOptimWrapper' and cpu.optim_wrapper.dtype == 'bfloat16'
    assert prepare_config(CFG).optim_wrapper.type == 'OptimWrapper'
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    gpu = prepare_config(CFG, amp=True)
    assert gpu.optim_wrapper.type == 'AmpOptimWrapper' and gpu.optim_wrapper.loss_scale == 'dynamic'


@pytest.mark.numerics
@pytest.mark.slow
def test_bf16_losses_close_to_float32():
    """The demo detector's bfloat16-autocast loss is within 5% of its float32 one, gradients finite.
    Built with XCiT-N12/16: two loss passes and backwards at 64x96 (bf16 emulated on AVX2 CPUs)."""
    from mmdet.testing import demo_mm_inputs
    cfg = Config.fromfile(CFG)
    cfg.model.backbone.arch = 'nano_12_p16'
    model = build_model(cfg).train()
    data = model.data_preprocessor(demo_mm_inputs(
        batch_size=1, image_shapes=[(3, 64, 96)], num_items=[3], num_classes=3, with_mask=True),
        True)
    ow = _wrapper(model)
    losses = {}
    for amp in (False, True):
        torch.manual_seed(0)
        if amp:
            with ow.optim_context(model):
                loss, _ = model.parse_losses(model(**data, mode='loss'))
        else:
            loss, _ = model.parse_losses(model(**data, mode='loss'))
        loss.backward()
        losses[amp] = loss.item()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    assert losses[True] != losses[False]  # bf16 did compute something
    assert losses[True] == pytest.approx(losses[False], rel=0.05)



@pytest.mark.slow
def test_train_amp_on_cpu_gives_finite_losses(shapes, tmp_path):
    """tools/train.py --amp on the CPU: finite losses. ~10 s: a training process."""
    iters = 3
    cmd = [sys.executable, os.path.join(ROOT, 'tools', 'train.py'), CFG, '--amp', '--work-dir',
           str(tmp_path), '--cfg-options', f'train_dataloader.dataset.data_root={shapes}/',
           'model.backbone.arch=nano_12_p16', 'train_dataloader.batch_size=1',
           'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
           # 96x64: bf16 is emulated on AVX2 CPUs; the demo's one anchor ratio needs > 1 anchor a
           # level (mmdet 3.3's RPN squeezes a single score to a scalar and fails)
           'train_dataloader.dataset.pipeline.2.scale=(96,64)',
           'train_dataloader.dataset.pipeline.2.keep_ratio=False',
           'model.train_cfg.rcnn.sampler.num=32', f'train_cfg.max_iters={iters}',
           'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None',
           'param_scheduler.0.end=1', 'param_scheduler.1.begin=1', f'param_scheduler.1.end={iters}',
           'default_hooks.logger.interval=1', 'default_hooks.checkpoint.interval=100']
    env = dict(os.environ, PYTHONWARNINGS='ignore', OMP_NUM_THREADS='2')
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (dumped,) = glob.glob(str(tmp_path / '*.py'))  # the config the run used
    assert Config.fromfile(dumped).optim_wrapper.type == 'CPUAmpOptimWrapper'
    (scalars,) = glob.glob(str(tmp_path / '*' / 'vis_data' / 'scalars.json'))
    with open(scalars) as f:
        rows = [json.loads(line) for line in f]
    losses = [r['loss'] for r in rows if 'loss' in r]
    assert len(losses) == iters and all(math.isfinite(v) for v in losses), losses
