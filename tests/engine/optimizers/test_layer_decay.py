"""Layer-wise lr decay constructor: the parameter groups of built mmdet and mmseg models."""

import pytest
import timm
import torch
from conftest import DEMO_DET, stock_config
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, init_default_scope

from deepvit_mm import ColumnarLayerDecayOptimizerConstructor, XCiT
from deepvit_mm.engine.optimizers.optim_wrapper_constructors import no_weight_decay_names

LR, WD, RATE = 1e-4, 0.05, 0.65
DEMO = DEMO_DET
UPERNET = 'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py'


def _optim_cfg(**paramwise):
    return dict(type='OptimWrapper', constructor='ColumnarLayerDecayOptimizerConstructor',
                optimizer=dict(type='AdamW', lr=LR, weight_decay=WD),
                paramwise_cfg=dict(decay_rate=RATE, **paramwise))


def _mask_rcnn(**backbone):
    from mmdet.registry import MODELS
    cfg = Config.fromfile(DEMO)
    # all 12 blocks (the demo itself builds 8)
    cfg.model.backbone.update(arch='nano_12_p16', out_indices=(3, 5, 7, 11), **backbone)
    init_default_scope('mmdet')
    return MODELS.build(cfg.model)


def _upernet():
    from mmseg.registry import MODELS
    cfg = Config.fromfile(stock_config(UPERNET))
    cfg.model.pretrained = None
    cfg.model.backbone = dict(type='XCiT', arch='nano_12_p16')
    cfg.model.decode_head.update(in_channels=[128] * 4, channels=32)
    cfg.model.auxiliary_head.update(in_channels=128, channels=32)
    init_default_scope('mmseg')
    return MODELS.build(cfg.model)


def _expected_layer(name: str, depth: int) -> int:
    if name.startswith('backbone.trunk.blocks.'):
        return int(name.split('.')[3]) + 1
    if name.startswith(('backbone.trunk.patch_embed.', 'backbone.trunk.pos_embed.')):
        return 0
    assert not name.startswith('backbone.trunk.'), name
    return depth + 1


def _groups_by_name(optim_wrapper):
    out = {}
    for g in optim_wrapper.optimizer.param_groups:
        assert len(g['params']) == len(g['param_names'])
        for n in g['param_names']:
            assert n not in out, f'{n} in two groups'
            out[n] = g
    return out


@pytest.mark.parametrize('build,scope', [(_mask_rcnn, 'mmdet'), (_upernet, 'mmseg')])
def test_groups_of_a_built_model(build, scope):
    model = build()
    init_default_scope(scope)  # the constructor is found in mmdet's and mmseg's registries
    ow = build_optim_wrapper(model, _optim_cfg(num_layers=12))
    groups = _groups_by_name(ow)
    params = dict(model.named_parameters())
    assert groups.keys() == params.keys()
    for name, g in groups.items():
        layer = _expected_layer(name, 12)
        assert g['layer_id'] == layer, name
        assert g['lr'] == pytest.approx(LR * RATE ** (13 - layer)), name
    # no weight decay: norms (by type), 1-D (biases, LayerScale gammas), XCA temperature
    # (declared by timm's XCA.no_weight_decay, a 3-D tensor), the Fourier position encoding
    # (Xcit.no_weight_decay 'pos_embed.*': its conv weight is 4-D); decay: conv/linear weights
    norm_params = {f'{m}.{n}' for m, mod in model.named_modules()
                   if isinstance(mod, (torch.nn.LayerNorm, torch.nn.modules.batchnorm._BatchNorm))
                   for n, _ in mod.named_parameters(recurse=False)}
    assert norm_params
    for name, p in params.items():
        want_no_decay = (name in norm_params or p.ndim <= 1 or name.endswith('.temperature')
                         or name.startswith('backbone.trunk.pos_embed.'))
        assert groups[name]['weight_decay'] == (0. if want_no_decay else WD), name
        assert groups[name]['decay'] is not want_no_decay
    assert groups['backbone.trunk.blocks.3.attn.temperature']['weight_decay'] == 0
    assert groups['backbone.trunk.pos_embed.token_projection.weight']['weight_decay'] == 0
    assert groups['backbone.trunk.blocks.0.gamma1']['weight_decay'] == 0
    assert groups['backbone.trunk.blocks.0.attn.qkv.weight']['weight_decay'] == WD
    assert groups['backbone.trunk.patch_embed.proj.0.0.weight']['lr'] == pytest.approx(LR * RATE ** 13)
    assert groups['backbone.adapter.levels.0.0.weight']['lr'] == pytest.approx(LR)
    # merged: one group per (layer, decay) here, not one per tensor
    assert len(ow.optimizer.param_groups) == len({(g['layer_id'], g['decay'])
                                                  for g in groups.values()})


def test_registered_in_mmengine_mmdet_and_mmseg():
    from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMDET
    from mmseg.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMSEG
    for registry in (OPTIM_WRAPPER_CONSTRUCTORS, MMDET, MMSEG):
        assert registry.module_dict['ColumnarLayerDecayOptimizerConstructor'] is \
            ColumnarLayerDecayOptimizerConstructor


def test_frozen_parameters_are_left_out_and_mmengine_options_still_apply():
    model = _mask_rcnn(frozen_stages=2)
    ow = build_optim_wrapper(model, _optim_cfg(custom_keys={'neck': dict(lr_mult=0.5)}))
    groups = _groups_by_name(ow)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and not frozen & groups.keys()
    assert {g['layer_id'] for g in groups.values()} == set(range(3, 14))
    assert groups['neck.fpn_convs.0.conv.weight']['lr'] == pytest.approx(0.5 * LR)
    assert groups['neck.fpn_convs.0.conv.bias']['weight_decay'] == 0
    assert groups['rpn_head.rpn_conv.weight']['lr'] == pytest.approx(LR)


@pytest.mark.slow
def test_a_whole_training_step_with_the_groups():
    """One AdamW step over the layer-decay groups changes every parameter. XCiT-N12/16 built, a
    forward and backward at 64x64, then the step."""
    model = XCiT('nano_12_p16')
    ow = build_optim_wrapper(model, _optim_cfg())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ow.update_params(sum(o.square().mean() for o in model(torch.randn(1, 3, 64, 64))))
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)


def test_no_weight_decay_names_follow_timm_declarations():
    # CaiT declares its position embedding and class token (3-D tensors) in no_weight_decay()
    cait = timm.create_model('cait_xxs24_224', pretrained=False, num_classes=0)
    names = no_weight_decay_names(cait)
    assert {'pos_embed', 'cls_token', 'blocks.0.gamma_1', 'blocks.0.norm1.weight'} <= names
    assert 'blocks.0.attn.qkv.weight' not in names and 'patch_embed.proj.weight' not in names


@pytest.mark.parametrize('paramwise,match', [
    (dict(decay_rate=0.65, num_layers=24), 'runs 12 blocks'),
    (dict(decay_rate=1.5), 'decay_rate'),
    (dict(num_layers=12), 'decay_rate'),
])
def test_bad_settings_refused(paramwise, match):
    cfg = _optim_cfg()
    cfg['paramwise_cfg'] = paramwise
    with pytest.raises(ValueError, match=match):
        build_optim_wrapper(XCiT('nano_12_p16'), cfg)


def test_a_model_without_a_columnar_backbone_is_refused():
    with pytest.raises(ValueError, match='exactly one columnar backbone'):
        build_optim_wrapper(torch.nn.Linear(3, 3), _optim_cfg())


def test_at_rate_1_it_differs_from_no_decay_on_scales_only_in_biases():
    """At decay_rate=1 this constructor and the opt-in NoDecayOnScalesOptimizerConstructor agree on
    every parameter but the biases that are neither in a norm layer nor named by a key, which the
    latter (as the official recipes) decays and this constructor (as BEiT's) does not."""
    model = _mask_rcnn()
    recipe = Config.fromfile(DEMO).optim_wrapper
    scales = dict(recipe, constructor='NoDecayOnScalesOptimizerConstructor')
    ctor = dict(recipe, constructor='ColumnarLayerDecayOptimizerConstructor',
                paramwise_cfg=dict(decay_rate=1.0))
    names = {id(p): n for n, p in model.named_parameters()}
    got = {}
    for cfg in (scales, ctor):
        for g in build_optim_wrapper(model, cfg).optimizer.param_groups:
            for p in g['params']:
                got.setdefault(names[id(p)], []).append((g['lr'], g['weight_decay']))
    lr, wd = recipe.optimizer.lr, recipe.optimizer.weight_decay
    differ = {n for n, (a, b) in got.items() if a != b}
    norm_biases = {f'{m}.bias' for m, mod in model.named_modules()
                   if isinstance(mod, (torch.nn.LayerNorm, torch.nn.modules.batchnorm._BatchNorm))}
    declared = {n for n in got if '.pos_embed.' in n}  # timm's Xcit declares its Fourier encoding
    assert differ and differ == {n for n in got if n.endswith('.bias')} - norm_biases - declared
    assert all(got[n] == [(lr, wd), (lr, 0.)] for n in differ)


def test_no_decay_on_scales_without_paramwise_cfg():
    """The opt-in exempts the scales with no paramwise_cfg too (mmengine groups parameters only
    for a non-empty one): a LayerNorm's weight and bias skip decay, a Linear's weight and bias
    decay."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    cfg = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
               constructor='NoDecayOnScalesOptimizerConstructor')
    names = {id(p): n for n, p in model.named_parameters()}
    got = {names[id(p)]: g['weight_decay']
           for g in build_optim_wrapper(model, cfg).optimizer.param_groups for p in g['params']}
    assert got == {'0.weight': 0.05, '0.bias': 0.05, '1.weight': 0.0, '1.bias': 0.0}
