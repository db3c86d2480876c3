"""``CPUSingleRoIExtractor`` against mmdet's ``SingleRoIExtractor`` with mmcv's RoIAlign: the same
outputs and feature gradients (float32 rounding) for every layer setting the fast path takes, and
the parent's own forward for the settings it does not."""
import pytest
import torch
from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor

from deepvit_mm.engine.optimizers.mmcv_ops_in_float32 import run_mmcv_ops_in_float32
from deepvit_mm.models.roi_heads import CPUSingleRoIExtractor
from deepvit_mm.models.roi_heads.roi_extractors import cpu_single_level_roi_extractor as roi_extractor

pytestmark = pytest.mark.numerics  # bounds that depend on the CPU's kernels

STRIDES = (4, 8, 16, 32)


def _rois(n: int, size: int, batch: int) -> torch.Tensor:
    """RoIs of every kind: inside, across and beyond the borders, thin, under a pixel, whole
    image, mixed over the levels' scales."""
    g = torch.Generator().manual_seed(n)
    x1 = torch.rand(n, generator=g) * size * 1.2 - 0.2 * size
    y1 = torch.rand(n, generator=g) * size * 1.2 - 0.2 * size
    w = torch.rand(n, generator=g) ** 2 * size * 0.9 + 0.3
    h = torch.rand(n, generator=g) ** 2 * size * 0.9 + 0.3
    rois = torch.stack([torch.randint(0, batch, (n,), generator=g).float(),
                        x1, y1, x1 + w, y1 + h], 1)
    extra = torch.tensor([[0, 0, 0, size, size], [batch - 1, -50, 10, -10, 30],
                          [0, size - 1, size - 1, size + 40, size + 40], [0, 5, 5, 5.2, 200]])
    return torch.cat([rois, extra])


def _pair(strides=STRIDES, **layer):
    kwargs = dict(roi_layer=dict(type='RoIAlign', **layer), out_channels=16,
                  featmap_strides=list(strides))
    return SingleRoIExtractor(**kwargs), CPUSingleRoIExtractor(**kwargs)


def _feats(strides, size=128, batch=2, dtype=torch.float32):
    return [torch.randn(batch, 16, size // s, size // s, dtype=dtype, requires_grad=True)
            for s in strides]


def _run(extractor, feats, rois, grad, **kwargs):
    out = extractor(feats, rois, **kwargs)
    return out, torch.autograd.grad(out, feats, grad.to(out.dtype), allow_unused=True)


def _assert_close(ref, new, atol):
    (out_ref, grads_ref), (out_new, grads_new) = ref, new
    assert out_new.shape == out_ref.shape and out_new.dtype == out_ref.dtype
    torch.testing.assert_close(out_new, out_ref, atol=atol, rtol=0)
    for g_ref, g_new in zip(grads_ref, grads_new):
        g_ref = torch.zeros_like(g_new) if g_ref is None else g_ref
        torch.testing.assert_close(g_new, g_ref, atol=atol, rtol=0)


@pytest.mark.parametrize('strides', [STRIDES, (8,)], ids=['4 levels', '1 level'])
@pytest.mark.parametrize('output_size,sampling_ratio', [(7, 2), (14, 2), (7, 1), ((5, 3), 3)])
@pytest.mark.parametrize('aligned', [True, False])
def test_equals_mmcv_roi_align(strides, output_size, sampling_ratio, aligned, monkeypatch):
    ref, new = _pair(strides, output_size=output_size, sampling_ratio=sampling_ratio,
                     aligned=aligned)
    calls = []
    gather = roi_extractor.roi_align_gather
    monkeypatch.setattr(roi_extractor, 'roi_align_gather',
                        lambda *a, **k: calls.append(1) or gather(*a, **k))
    feats, rois = _feats(strides), _rois(60, 128, 2)
    grad = torch.randn(len(rois), 16, *ref.roi_layers[0].output_size)
    _assert_close(_run(ref, feats, rois, grad), _run(new, feats, rois, grad), atol=2e-5)
    assert calls, 'the fast path did not run'
    # roi_scale_factor (mmdet's context RoIs) rescales them as the parent does
    _assert_close(_run(ref, feats, rois, grad, roi_scale_factor=1.5),
                  _run(new, feats, rois, grad, roi_scale_factor=1.5), atol=2e-5)


def test_bfloat16_autocast_equals_mmcv_in_float32():
    """Under CPU bfloat16 autocast (CPUAmpOptimWrapper) mmcv's RoIAlign runs in float32 on
    bfloat16 features and RoIs (``engine.optimizers.mmcv_ops_in_float32``); so does the gather,
    with the same dtype out."""
    run_mmcv_ops_in_float32()
    ref, new = _pair(output_size=7, sampling_ratio=2)
    feats, rois = _feats(STRIDES, dtype=torch.bfloat16), _rois(40, 128, 2)
    grad = torch.randn(len(rois), 16, 7, 7)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        expected, got = _run(ref, feats, rois, grad), _run(new, feats, rois, grad)
    assert got[0].dtype == torch.bfloat16
    _assert_close(expected, got, atol=2e-2)


@pytest.mark.parametrize('layer', [dict(output_size=7, sampling_ratio=0),
                                   dict(output_size=7, sampling_ratio=2, pool_mode='max'),
                                   dict(output_size=7, sampling_ratio=2, use_torchvision=True)],
                         ids=['adaptive samples', 'max pool', 'torchvision'])
def test_other_settings_run_the_parent_forward(layer, monkeypatch):
    monkeypatch.setattr(roi_extractor, 'roi_align_gather',
                        lambda *a, **k: pytest.fail('the gather took a setting it cannot'))
    ref, new = _pair(**layer)
    feats, rois = _feats(STRIDES), _rois(20, 128, 2)
    grad = torch.randn(len(rois), 16, 7, 7)
    _assert_close(_run(ref, feats, rois, grad), _run(new, feats, rois, grad), atol=0)


def test_no_rois():
    ref, new = _pair(output_size=7, sampling_ratio=2)
    feats = _feats(STRIDES)
    out = new(feats, torch.zeros(0, 5))
    assert out.shape == (0, 16, 7, 7)
    torch.testing.assert_close(out, ref(feats, torch.zeros(0, 5)))


def test_the_demo_detector_uses_it():
    from conftest import DEMO_DET, build_model
    from mmengine.config import Config
    model = build_model(Config.fromfile(DEMO_DET))
    for extractor in (model.roi_head.bbox_roi_extractor, model.roi_head.mask_roi_extractor):
        assert isinstance(extractor, CPUSingleRoIExtractor)
        assert extractor._gather_settings(tuple(_feats(STRIDES))) is not None
