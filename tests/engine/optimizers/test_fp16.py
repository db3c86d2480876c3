"""The float16 path of the Mask R-CNN recipes (float16 autocast with dynamic loss scaling, as the
official XCiT code trained), exercised on CPU: torch's ``GradScaler('cpu')`` under mmengine's
``AmpOptimWrapper`` logic (``CPUAmpOptimWrapper(dtype='float16')``).

CPUs without AVX512-FP16/AMX-FP16 emulate float16 arithmetic (an XCiT-S12 step is ~40x slower
than in float32 on an AVX-512 EPYC), so the recipes' training steps run at 64x64 with their heads
slimmed to 32 channels: the backbones, the precision path and the losses are the recipes' own.
UperNet's float16 step is left out: on that CPU it took 131 s (S12/16) and 340 s (S12/8) at 64x64
with 32-channel heads, against 4-10 s for Mask R-CNN.
"""
import copy
import os

import pytest
import torch
import torch.nn as nn
from conftest import CONFIG_DIR, build_model, randomize_, seg_inputs
from mmengine.config import Config
from mmengine.optim import OptimWrapper

from deepvit_mm import CaiT, XCiT
from deepvit_mm.engine import CPUAmpOptimWrapper, fit_precision_to_device
from deepvit_mm.engine.optimizers.cpu_amp_optim_wrapper import cpu_float16_training_problem

pytestmark = pytest.mark.skipif(cpu_float16_training_problem() is not None,
                                reason=str(cpu_float16_training_problem()))

# (recipe, overrides that slim its heads for emulated float16)
SLIM_DET = {'model.neck.out_channels': 32, 'model.rpn_head.in_channels': 32,
            'model.rpn_head.feat_channels': 32,
            'model.roi_head.bbox_roi_extractor.out_channels': 32,
            'model.roi_head.bbox_head.in_channels': 32,
            'model.roi_head.bbox_head.fc_out_channels': 64,
            'model.roi_head.mask_roi_extractor.out_channels': 32,
            'model.roi_head.mask_head.in_channels': 32,
            'model.roi_head.mask_head.conv_out_channels': 32,
            'model.train_cfg.rcnn.sampler.num': 32}
STEPS = [('mask_rcnn_xcit_s12_8_3x.py', SLIM_DET), ('mask_rcnn_xcit_s12_16_3x.py', SLIM_DET),
         ('mask_rcnn_cait_xxs24_3x.py', SLIM_DET)]


def _fp16_wrapper(model: nn.Module, **loss_scale) -> CPUAmpOptimWrapper:
    return CPUAmpOptimWrapper(dtype='float16', optimizer=torch.optim.SGD(model.parameters(), lr=0.),
                              **loss_scale)


def _recipe_model(name: str, slim: dict, with_cp: bool):
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, name))
    cfg.merge_from_dict(slim)
    assert cfg.optim_wrapper.type == ('AmpOptimWrapper' if 'mask_rcnn' in name else 'OptimWrapper')
    cfg.model.backbone.with_cp = with_cp
    if cfg.model.backbone.type == 'CaiT':
        cfg.model.backbone.window_size = 2  # the recipe's windows, at the test's 4x4 grid
    model = randomize_(build_model(cfg)).train()
    if cfg.default_scope == 'mmseg':
        data = seg_inputs(batch=2, h=64, w=64)
    else:
        from mmdet.testing import demo_mm_inputs
        data = demo_mm_inputs(batch_size=1, image_shapes=[(3, 64, 64)], num_items=[3],
                              num_classes=80, with_mask=True)
    return model, model.data_preprocessor(data, True)


def _loss_and_backbone_grad(model, data, wrapper):
    """One step's loss and the backbone's (unscaled) gradient, through the wrapper's own context,
    backward and unscaling; the same random draws (drop path, RoI sampling) for every call."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with wrapper.optim_context(model):
        loss, _ = model.parse_losses(model(**data, mode='loss'))
    wrapper.backward(loss)
    if isinstance(wrapper, CPUAmpOptimWrapper):
        wrapper.loss_scaler.unscale_(wrapper.optimizer)
    grads = [p.grad.float().flatten() for p in model.backbone.parameters() if p.grad is not None]
    assert len(grads) == sum(p.requires_grad for p in model.backbone.parameters())
    return loss.float(), torch.cat(grads)


@pytest.mark.parametrize('with_cp', [False, True], ids=['no_cp', 'with_cp'])
@pytest.mark.parametrize('name,slim', STEPS, ids=[s[0][:-3] for s in STEPS])
@pytest.mark.slow
def test_recipe_train_step_in_float16(name, slim, with_cp):
    """The recipe's step in float16: finite loss and gradients, no overflow at the initial scale,
    the loss within 10 % of float32's (measured: 1.4-3.7 %). The heads' proposals and RoI samples
    are discrete and move with float16 rounding, so the whole model's gradients are compared in
    the backbone test below, with the heads' gradient held fixed."""
    model, data = _recipe_model(name, slim, with_cp)
    loss32, _ = _loss_and_backbone_grad(model, data, OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.)))
    wrapper = _fp16_wrapper(model)
    loss16, grad16 = _loss_and_backbone_grad(model, data, wrapper)
    assert torch.isfinite(loss16) and torch.isfinite(grad16).all()
    assert wrapper.loss_scaler.get_scale() == 2. ** 16  # torch's initial scale: no overflow
    assert abs(loss16 - loss32) <= 0.1 * abs(loss32), (loss16, loss32)


BACKBONES = {'xcit_s12_p8': lambda cp: XCiT('small_12_p8', with_cp=cp),
             'xcit_s12_p16': lambda cp: XCiT('small_12_p16', with_cp=cp),
             'cait_xxs24_windowed': lambda cp: CaiT('xxs24', window_size=2, with_cp=cp)}


@pytest.mark.numerics
@pytest.mark.parametrize('with_cp', [False, True], ids=['no_cp', 'with_cp'])
@pytest.mark.parametrize('arch', sorted(BACKBONES))
@pytest.mark.slow
def test_backbone_gradients_in_float16_match_float32(arch, with_cp):
    """The recipes' backbones trained under float16 autocast: every parameter's gradient, for the
    same gradient arriving from the heads, within 3 % (L2 over the whole backbone) of float32's
    (measured: XCiT-S12/16 0.06 %, S12/8 1.0 %, CaiT-XXS24 0.5 %)."""
    torch.manual_seed(0)
    model = randomize_(BACKBONES[arch](with_cp)).train()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        cotangents = [torch.randn_like(o) for o in model(x)]
    grads = []
    for fp16 in (False, True):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same drop-path draws
        with torch.autocast('cpu', dtype=torch.float16, enabled=fp16):
            outs = model(x)
        # autocast ran (levels taken straight from a LayerNorm stay float32)
        assert any(o.dtype == torch.float16 for o in outs) == fp16
        torch.autograd.backward([o.float() for o in outs], cotangents)
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
        grads.append(torch.cat([p.grad.float().flatten() for p in model.parameters()
                                if p.requires_grad]))
    g32, g16 = grads
    assert torch.isfinite(g16).all()
    assert (g16 - g32).norm() <= 0.03 * g32.norm()


@pytest.mark.slow
def test_loss_scale_backs_off_on_overflow_and_grows_again():
    """mmengine's train_step with the float16 wrapper: an overflow (an inf injected into one
    gradient once) skips that update and halves the scale; finite steps grow it back."""
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py'))
    cfg.model.backbone.arch = 'nano_12_p16'  # emulated float16: the smaller grid
    model = build_model(cfg).train()
    from mmdet.testing import demo_mm_inputs
    data = demo_mm_inputs(batch_size=1, image_shapes=[(3, 96, 128)], num_items=[3], num_classes=3,
                          with_mask=True)
    wrapper = CPUAmpOptimWrapper(dtype='float16',
                                 loss_scale=dict(init_scale=1024., growth_interval=2),
                                 optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    overflow = []
    param = model.backbone.trunk.patch_embed.proj[0][0].weight  # the first layer
    param.register_hook(lambda grad: grad * float('inf') if overflow.pop() else grad)
    scales = []
    for inject_now in (False, True, False, False):
        overflow.append(inject_now)
        before = param.detach().clone()
        model.train_step(data, wrapper)
        moved = not torch.equal(before, param)
        assert moved != inject_now  # the overflowing step is skipped, the others update
        scales.append(wrapper.loss_scaler.get_scale())
    assert scales == [1024., 512., 512., 1024.]
    # the scale is part of the checkpoint, as with mmengine's AmpOptimWrapper
    state = wrapper.state_dict()
    fresh = _fp16_wrapper(model)
    fresh.load_state_dict(copy.deepcopy(state))
    assert fresh.loss_scaler.get_scale() == 1024.


def test_bfloat16_wrapper_scales_nothing():
    model = nn.Linear(4, 2)
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    loss = model(torch.randn(3, 4)).sum()
    assert wrapper.loss_scaler.scale(loss) is loss
    with pytest.raises(ValueError, match="'bfloat16' or 'float16'"):
        CPUAmpOptimWrapper(dtype='float32', optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_recipe_precision_without_a_gpu_is_float32_and_said(monkeypatch):
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, 'mask_rcnn_xcit_s12_8_3x.py'))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    note = fit_precision_to_device(cfg)
    assert cfg.optim_wrapper.type == 'OptimWrapper'
    assert 'loss_scale' not in cfg.optim_wrapper and 'dtype' not in cfg.optim_wrapper
    assert 'float16' in note and 'float32' in note
    assert fit_precision_to_device(cfg) is None  # once


# ------------------------------------------------------------------ every fast path in float16
def _err(outs, exact) -> float:
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    exact = exact if isinstance(exact, (list, tuple)) else [exact]
    return max(((o.float() - e).abs().max() / e.abs().max()).item() for o, e in zip(outs, exact))


def _fp16(fn, *args):
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16):
        return fn(*args)


def _fp32(fn, *args):
    with torch.no_grad():
        return fn(*args)


def _xcit_pair(**kw):
    fast = randomize_(XCiT('nano_12_p16', gram_xca=True, **kw)).eval()
    ref = copy.deepcopy(fast)
    ref.gram_xca = False
    return fast, ref


def _cait_query_chunks():
    fast = randomize_(CaiT('xxs24', query_chunks=True, out_indices=(0, 1, 2, 3))).eval()
    ref = copy.deepcopy(fast)
    ref.query_chunks = False
    return fast, ref


def _cait_windows():
    # windowed attention against the same model's global attention (timm's)
    fast = randomize_(CaiT('xxs24', window_size=2, global_blocks=(3,),
                           out_indices=(0, 1, 2, 3))).eval()
    ref = randomize_(CaiT('xxs24', out_indices=(0, 1, 2, 3))).eval()
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def _adapter_gemm():
    from deepvit_mm.models.backbones.columnar_pyramid import ConvTranspose2x2
    ref = nn.ConvTranspose2d(64, 32, kernel_size=2, stride=2)
    fast = ConvTranspose2x2(64, 32)
    fast.load_state_dict(ref.state_dict())
    return fast, ref


def _fsne():
    # F-SNE's embedding against XCiT's linear one, each against its own float32 result
    fast = randomize_(XCiT('nano_12_p16', qkv_cfg=dict(type='FSNE', code_size=8))).eval()
    ref = randomize_(XCiT('nano_12_p16')).eval()
    return fast, ref


FAST_PATHS = {'gram_xca': (_xcit_pair, (2, 3, 64, 96)),
              'query_chunks': (_cait_query_chunks, (2, 3, 64, 96)),
              'windowed_attention': (_cait_windows, (2, 3, 64, 96)),
              'adapter_gemm': (_adapter_gemm, (2, 64, 12, 20)),
              'fsne': (_fsne, (2, 3, 64, 96))}


@pytest.mark.numerics
@pytest.mark.parametrize('path', sorted(FAST_PATHS))
@pytest.mark.slow
def test_fast_path_in_float16_as_accurate_as_the_reference(path):
    """Each fast path's float16 result against its own float32 result: no worse than twice the
    float16 error of the reference path (timm's forward, PyTorch's layer) on the same input."""
    build, shape = FAST_PATHS[path]
    torch.manual_seed(0)
    fast, ref = build()
    x = torch.randn(*shape)
    err_fast = _err(_fp16(fast, x), _fp32(fast, x))
    err_ref = _err(_fp16(ref, x), _fp32(ref, x))
    assert err_fast > 0  # float16 did compute something
    assert err_fast < 2 * err_ref + 1e-3, (err_fast, err_ref)
