"""ONNX export (deepvit_mm.deploy, tools/deploy/export_onnx.py) against PyTorch in ONNX Runtime.

Every export here is ``--dynamic``: one file, run at two input sizes. The models are the demo
configs cut to the fewest blocks that still hold each kind of block (the blocks after the last tap
are not built): the columnar pyramids' four taps ``out_indices=(0, 1, 2, 3)``, the simple
pyramid's one block, the windowed ViT's first windowed block and a global one. That keeps
each export to ~10-40 s on a 2-core CPU; the exported code is the same at any depth.
"""
import glob
import os
import re
import subprocess
import sys

import mmcv
import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import ROOT

from deepvit_mm.compat.torch import TORCH_VERSION
from deepvit_mm.deploy import (
    check_export,
    dynamic_range,
    example_input,
    export_onnx,
    load_model,
    max_rel_err,
    onnx_dynamo_export_problem,
    onnxruntime_session,
    run_onnx,
    wrap_for_export,
)
from deepvit_mm.deploy.export import require
from deepvit_mm.deploy.parity import match_detections
from deepvit_tools.demo_data import make_shapes_coco

# tools/setup_env.sh installs .[tests,deploy]: a missing package is an error here, not a skip
for _module in ('onnx', 'onnxruntime', 'onnxscript'):
    require(_module)

EXPORT_TOOL = os.path.join(ROOT, 'tools', 'deploy', 'export_onnx.py')
SEG_CFG = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
DET_CFG = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
CAIT_CFG = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_cait_xxs24_shapes.py')
VIT_CFG = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_vit_tiny_simple_shapes.py')
# EVA-02 (patch 14: the taps resampled to the 16-pixel grid, rotary embedding) with ViT's demo
EVA = {'model.backbone.type': 'TimmEVA', 'model.backbone.arch': 'eva02_tiny_patch14_224'}
SHALLOW = {'model.backbone.out_indices': (0, 1, 2, 3)}
EXPORT_PROBLEM = onnx_dynamo_export_problem()
# torch 2.1 has no torch.onnx.export(dynamo=True): there the export is refused (tested below)
exports = pytest.mark.skipif(EXPORT_PROBLEM is not None, reason=str(EXPORT_PROBLEM))
SIZES = ((128, 192), (224, 160))  # traced at the first; both multiples of 32, not square
TOL = 1e-4


def _nontrivial_statistics(model: nn.Module) -> None:
    """BatchNorm statistics and LayerScale factors away from their initial values, so that
    parity covers them: fresh BN statistics are 0/1, and CaiT's LayerScale starts at 1e-5, which
    would leave attention (its windows, its position embedding) out of every output."""
    gen = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=gen) * 0.4 - 0.2)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) * 0.4 + 0.8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if re.search(r'\.gamma_?\d$', name):  # XCiT gamma1..3, CaiT gamma_1, gamma_2
                p.copy_(torch.rand(p.shape, generator=gen) * 0.5 + 0.5)


def _save(model: nn.Module, path) -> str:
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, str(path))
    return str(path)


@pytest.mark.slow
def test_export_runs_on_the_newest_stack_and_is_refused_at_once_elsewhere(tmp_path):
    """torch 2.13 exports (the tests above run); torch 2.1 has no dynamo exporter: the tool stops
    before building the model, with what to do, and the API raises the same."""
    if TORCH_VERSION >= (2, 13):
        assert EXPORT_PROBLEM is None
    if EXPORT_PROBLEM is None:
        return
    assert re.search(r'torch\.onnx\.export\(dynamo=True\).*tested with torch 2\.13\.0.*'
                     r'requirements/constraints\.txt', EXPORT_PROBLEM)
    res = subprocess.run([sys.executable, EXPORT_TOOL, SEG_CFG, 'none', '--out',
                          str(tmp_path / 'x.onnx')], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 1 and EXPORT_PROBLEM in res.stderr, res.stderr[-2000:]
    assert not os.path.exists(tmp_path / 'x.onnx')
    with pytest.raises(RuntimeError, match='dynamo=True'):
        export_onnx(None, str(tmp_path / 'y.onnx'), (64, 64))


def _export_with_tool(cfg, checkpoint, out, *args, run=None) -> str:
    """``tools/deploy/export_onnx.py`` in a fresh process (its own verification skipped: the
    tests compare), or through ``run`` (the ``in_process`` fixture) in this one."""
    argv = [cfg, str(checkpoint), '--out', str(out), '--dynamic', '--shape', str(SIZES[0][0]),
            str(SIZES[0][1]), '--no-verify', *args]
    if run is not None:
        res = run(EXPORT_TOOL, *argv, cwd=ROOT)
    else:
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'))
        res = subprocess.run([sys.executable, EXPORT_TOOL, *argv], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert os.path.isfile(out)
    return str(out)


# XCiT's dynamic export: the segmentor's (test_segmentor_export_tool_matches_pytorch_at_two_sizes,
# its FPN reads all four levels), and its backbone alone at a fixed size (the fixed-size test)
@exports
@pytest.mark.parametrize('cfg, options, sizes', [
    (CAIT_CFG, SHALLOW, SIZES),
    (VIT_CFG, {'model.backbone.out_indices': (0,)}, SIZES),
    (VIT_CFG, {**EVA, 'model.backbone.out_indices': (0,)}, SIZES),
    # block 0 windowed, block 1 global (as ViTDet's global blocks are, between windowed ones)
    (VIT_CFG, {'model.backbone.out_indices': (1,), 'model.backbone.window_size': 4,
               'model.backbone.global_blocks': (1,)}, SIZES),
], ids=['cait_xxs24', 'vit_tiny_simple', 'eva02_tiny_simple', 'vit_tiny_windows'])
@pytest.mark.slow
def test_backbone_dynamic_export_matches_pytorch_at_two_sizes(tmp_path, cfg, options, sizes):
    """A backbone exported with dynamic sizes equals PyTorch's outputs at two sizes in ONNX Runtime.
    ~10-50 s: torch.export and the ONNX translation of each."""
    model, task = load_model(cfg, None, options, backbone_only=True)
    _nontrivial_statistics(model)
    wrapper = wrap_for_export(model, task, backbone_only=True)
    # windows: from more than one window a side (4 patches of 16: 65 px, rounded up to 96)
    assert dynamic_range(wrapper) == (96 if 'model.backbone.window_size' in options else 64, 2048)
    path = export_onnx(wrapper, str(tmp_path / 'backbone.onnx'), sizes[0], dynamic=True)
    session = onnxruntime_session(path)
    assert [o.name for o in session.get_outputs()] == ['stride4', 'stride8', 'stride16', 'stride32']
    for h, w in sizes:
        x = example_input((h, w), seed=h)
        with torch.no_grad():
            ref = wrapper(x)
        out = run_onnx(session, x)
        assert [o.shape for o in out] == [(1, model.backbone.embed_dim, h // s, w // s)
                                          for s in (4, 8, 16, 32)]
        assert max_rel_err(ref, out) < TOL, (h, w)


@exports
def test_windowed_cait_dynamic_range_starts_above_one_window(tmp_path):
    """A grid that fits in one window is attended globally (unpadded), a computation the
    windowed graph cannot switch to: a --dynamic windowed CaiT starts at 256 px (14-patch
    windows at /16) and an example below is refused before tracing. (Its parity at 256x320 and
    352x256 was checked by hand, docs/deployment.md: its export takes minutes, too long here.)"""
    opts = {'model.backbone.out_indices': (1, 3, 5, 7), 'model.backbone.window_size': 14}
    model, task = load_model(CAIT_CFG, None, opts, backbone_only=True)
    wrapper = wrap_for_export(model, task, backbone_only=True)
    assert dynamic_range(wrapper) == (256, 2048)
    with pytest.raises(ValueError, match=r'in \[256, 2048\]'):
        export_onnx(wrapper, str(tmp_path / 'x.onnx'), (224, 256), dynamic=True)


@exports
def test_backbone_auto_choices_are_fixed_while_exporting():
    """'auto' decides per input in eager mode; while exporting it is a fixed path, so a graph
    traced at one size computes the same at another (what the tests above rely on)."""
    from deepvit_mm.models.backbones.cait.window_attention import default_query_chunk
    from deepvit_mm.models.backbones.xcit import fast as xcit_fast
    x = torch.zeros(1, 4096, 128)  # many tokens: the fast path helps on CPU
    assert xcit_fast.fast_path_helps(x) and not xcit_fast.fast_path_helps(x[:, :16])
    assert default_query_chunk(torch.device('cpu')) is not None

    class Probe(nn.Module):
        def forward(self, t):
            seen.update(fast=xcit_fast.fast_path_helps(t), chunk=xcit_fast.default_chunk(t.device),
                        query_chunk=default_query_chunk(t.device))
            return t + 1

    seen = {}
    torch.export.export(Probe(), (x[:, :16],))
    assert seen == dict(fast=xcit_fast.EXPORT_FAST_PATH, chunk=None, query_chunk=None)


@exports
@pytest.mark.slow
def test_segmentor_export_tool_matches_pytorch_at_two_sizes(tmp_path):
    """The tool end to end: a checkpoint through the safe loader, one ``--dynamic`` file (from 64
    px: XCiT has no windows), ``seg_logits`` at both sizes within 1e-4 of the segmentor's
    ``encode_decode``. ~30-50 s: the tool's process and its export."""
    model, task = load_model(SEG_CFG, None, SHALLOW)
    assert dynamic_range(wrap_for_export(model, task)) == (64, 2048)
    _nontrivial_statistics(model)
    ckpt = _save(model, tmp_path / 'segmentor.pth')
    path = _export_with_tool(SEG_CFG, ckpt, tmp_path / 'segmentor.onnx', '--cfg-options',
                             'model.backbone.out_indices=(0,1,2,3)')
    session = onnxruntime_session(path)
    assert [o.name for o in session.get_outputs()] == ['seg_logits']
    for h, w in SIZES:
        x = example_input((h, w), seed=h)
        with torch.no_grad():
            ref = model.encode_decode(x, [dict(img_shape=(h, w))])
        (out,) = run_onnx(session, x)
        assert out.shape == (1, model.decode_head.num_classes, h, w)
        assert max_rel_err([ref], [out]) < TOL, (h, w)


@exports
@pytest.mark.slow
def test_fixed_size_export_refuses_other_sizes_and_dynamic_needs_multiples_of_32(tmp_path):
    """A fixed-size export refuses other sizes; a dynamic one needs multiples of 32. ~5-15 s: an
    ONNX export."""
    model, task = load_model(SEG_CFG, None, SHALLOW, backbone_only=True)
    wrapper = wrap_for_export(model, task, backbone_only=True)
    with pytest.raises(ValueError, match='multiples of 32'):
        export_onnx(wrapper, str(tmp_path / 'x.onnx'), (100, 128), dynamic=True)
    path = export_onnx(wrapper, str(tmp_path / 'fixed.onnx'), (64, 96))
    assert check_export(wrapper, onnxruntime_session(path), [(64, 96)])[0]['max_rel_err'] < TOL
    with pytest.raises(Exception, match='(?i)dimension|shape'):
        run_onnx(onnxruntime_session(path), example_input((96, 64)))


# --------------------------------------------------------------------------------------------
# detector
# --------------------------------------------------------------------------------------------
def _decisive_random_weights(model: nn.Module) -> None:
    """Random weights whose classifiers give spread-out scores.

    A freshly initialised Mask R-CNN scores every RoI ~1/(K+1) for every class (``fc_cls`` is
    initialised with std 0.01): all scores tie, no box reaches 0.3, and which boxes survive NMS
    would be decided by float rounding. Here the RPN's and the box head's classifier weights are
    drawn with std 0.2 and the background logit is lowered by 2: on the held-out demo images
    that gives 54-62 boxes above 0.3 per image (of 100 kept), through the whole pipeline (RPN
    top-k and NMS, RoIAlign, box decoding, per-class NMS, masks). Nothing is trained: a training
    run to confident scores takes minutes on 2 CPU cores (80 demo iterations still left every
    score below 0.3).
    """
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in (model.rpn_head.rpn_cls, model.roi_head.bbox_head.fc_cls):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.2)
        model.roi_head.bbox_head.fc_cls.bias[-1] = -2.0  # mmdet: background is the last class


def _preprocess(model, img: np.ndarray):
    """An image through the detector's own data preprocessor (BGR->RGB, normalise, pad)."""
    from mmdet.structures import DetDataSample
    h, w = img.shape[:2]
    sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w),
                                         scale_factor=(1.0, 1.0)))
    data = model.data_preprocessor(
        dict(inputs=[torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)],
             data_samples=[sample]), False)
    return data['inputs'], data['data_samples']


@exports
@pytest.mark.slow
def test_detector_export_tool_matches_mmdet_boxes_on_held_out_images(tmp_path, in_process):
    """Boxes scoring above 0.3 in mmdet's own ``predict`` (mmcv's RoIAlign and NMS) are found by
    the exported file with the same label and IoU > 0.95, one to one, on the held-out demo
    images at their size and resized to another; their mask probabilities agree with mmdet's mask
    head's (within 1e-3) on those boxes. The tool runs in this process (the segmentor's test
    starts it as one); ~30-40 s: the detector's export."""
    from mmdet.structures.bbox import bbox2roi
    data = make_shapes_coco(str(tmp_path / 'shapes'), num_train=1, num_val=4, size=128, seed=3)
    images = sorted(glob.glob(os.path.join(data['root'], 'val', '*.png')))
    opts = dict(SHALLOW, **{'model.backbone.arch': 'nano_12_p16'})
    # the reference pools with mmcv's RoIAlign kernel (the demo's CPUSingleRoIExtractor equals it:
    # tests/models/roi_heads/test_roi_extractor.py); the export is the same whichever extractor the
    # config names
    opts.update({f'model.roi_head.{k}_roi_extractor.type': 'SingleRoIExtractor'
                 for k in ('bbox', 'mask')})
    model, task = load_model(DET_CFG, None, opts)
    _nontrivial_statistics(model)
    _decisive_random_weights(model)
    ckpt = _save(model, tmp_path / 'detector.pth')
    path = _export_with_tool(DET_CFG, ckpt, tmp_path / 'detector.onnx', '--cfg-options',
                             'model.backbone.arch=nano_12_p16',
                             'model.backbone.out_indices=(0,1,2,3)', run=in_process)
    session = onnxruntime_session(path)
    assert [o.name for o in session.get_outputs()] == ['dets', 'labels', 'masks']
    totals = dict(reference=0, exported=0, matched=0)
    for file in images:
        img = mmcv.imread(file)
        for size in ((128, 128), (160, 224)):
            inputs, samples = _preprocess(model, mmcv.imresize(img, size[::-1]))
            with torch.no_grad():
                ref = model.predict(inputs, samples, rescale=False)[0].pred_instances
            dets, labels, masks = (torch.as_tensor(o)[0] for o in run_onnx(session, inputs))
            m = match_detections(ref.bboxes, ref.scores, ref.labels, dets[:, :4], dets[:, 4],
                                 labels, score_thr=0.3, iou_thr=0.95)
            assert m['matched'] == m['reference'] == m['exported'], (file, size, m)
            for k in totals:
                totals[k] += m[k]
            # masks: mmdet's own mask head (mmcv RoIAlign) on its boxes, at RoI resolution
            keep_r = (ref.scores > 0.3).nonzero()[:, 0]
            keep_o = (dets[:, 4] > 0.3).nonzero()[:, 0]
            if len(keep_r):
                with torch.no_grad():
                    feats = model.extract_feat(inputs)
                    preds = model.roi_head._mask_forward(
                        feats, bbox2roi([ref.bboxes[keep_r]]))['mask_preds']
                probs = preds[torch.arange(len(keep_r)), ref.labels[keep_r]].sigmoid()
                for i, j in m['pairs']:
                    diff = float((probs[i] - masks[keep_o[j]]).abs().max())
                    assert diff < 1e-3, (file, size, i, diff)
    assert totals['reference'] >= 20, totals  # the comparison covers many boxes


@exports
@pytest.mark.slow
def test_onnx_speed_tool_times_both_runtimes_on_the_same_outputs(in_process):
    """tools/analysis/benchmark_onnx.py (docs/deployment.md's speed table): one row per size with
    both runtimes' medians of every timed call, their ratio, and the outputs' largest difference
    within the export tolerance; the command that reproduces it."""
    out = in_process(os.path.join(ROOT, 'tools', 'analysis', 'benchmark_onnx.py'), SEG_CFG,
                     '--parts', 'backbone', '--sizes', '64', '96x128', '--warmup', '0',
                     '--repeats', '3', '--cfg-options', 'model.backbone.out_indices=(0,1,2,3)',
                     cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [[c.strip() for c in line.strip('|').split('|')]
            for line in out.stdout.splitlines() if line.startswith('| sem_fpn')]
    assert [r[3] for r in rows] == ['64x64', '96x128']
    for r in rows:
        pytorch, ort, ratio, err = float(r[4]), float(r[5]), float(r[6]), float(r[7])
        # the medians are printed to the millisecond, their ratio to two digits
        assert pytorch >= 0 and ort >= 0
        assert (pytorch - 0.5) / (ort + 0.5) - 0.01 <= ratio <= (pytorch + 0.5) / max(ort - 0.5, 1e-3)
        assert err < TOL
    calls = re.findall(r'PyTorch ([\d ]+), ORT ([\d ]+)', out.stdout)
    assert [(len(p.split()), len(o.split())) for p, o in calls] == [(3, 3), (3, 3)]
    assert 'command: python tools/analysis/benchmark_onnx.py' in out.stdout
