"""Every config loads and builds its model; the detection recipes carry the paper's settings.

Configs are globbed at collection time, so a config added under ``configs/`` is tested without
editing this file; mmdet and mmseg configs are told apart by ``default_scope``.
"""
import glob
import os
import re
import textwrap

import pytest
import torch
from mmengine.config import Config
from mmengine.model.utils import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from deepvit_mm import XCiT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, 'configs')
CONFIGS = sorted(p for p in glob.glob(os.path.join(CONFIG_DIR, '**', '*.py'), recursive=True)
                 if '_base_' not in os.path.relpath(p, CONFIG_DIR).split(os.sep))
# the paper's Table 5 recipes: configs/mask_rcnn_xcit_<model>_<patch>_3x.py
RECIPE = re.compile(r'mask_rcnn_xcit_([a-z]\d+)_(8|16)_3x\.py')
DET_RECIPES = [p for p in CONFIGS
               if os.path.dirname(p) == CONFIG_DIR and RECIPE.fullmatch(os.path.basename(p))]
# Table 5: box AP / mask AP, COCO minival, Mask R-CNN 3x, ImageNet-1k pretraining
PAPER_AP = {('t12', '16'): (42.7, 38.5), ('t12', '8'): (44.5, 40.3),
            ('s12', '16'): (45.3, 40.8), ('s12', '8'): (47.0, 42.3),
            ('s24', '16'): (46.5, 41.8), ('s24', '8'): (48.1, 43.0),
            ('m24', '16'): (46.7, 42.0), ('m24', '8'): (48.5, 43.7)}
SIZES = {'t12': 'tiny_12', 's12': 'small_12', 's24': 'small_24', 'm24': 'medium_24'}


def _ids(paths):
    return [os.path.relpath(p, CONFIG_DIR) for p in paths]


def _registry(scope):
    if scope == 'mmseg':
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope(scope)
    return MODELS


def _build(cfg):
    """The config's model on CPU: no weights file needed, SyncBN reverted to BN as mmengine's
    Runner does in a non-distributed run."""
    cfg.model.backbone.init_cfg = None
    return revert_sync_batchnorm(_registry(cfg.get('default_scope', 'mmdet')).build(cfg.model))


@pytest.mark.parametrize('path', CONFIGS, ids=_ids(CONFIGS))
def test_config_builds_its_model(path):
    cfg = Config.fromfile(path)
    assert 'deepvit_mm' in cfg.custom_imports['imports']
    model = _build(cfg)
    channels = list(model.backbone.out_channels)
    # the first module after the backbone: a neck (FPN, MultiLevelNeck) or the decode head
    consumer = model.neck if getattr(model, 'neck', None) is not None else model.decode_head
    assert list(consumer.in_channels) == channels


def test_recipes_cover_table5():
    found = {RECIPE.fullmatch(os.path.basename(p)).groups() for p in DET_RECIPES}
    assert set(PAPER_AP) <= found


@pytest.mark.parametrize('path', DET_RECIPES, ids=_ids(DET_RECIPES))
def test_detection_recipe_hyper_parameters(path):
    model_tag, patch = RECIPE.fullmatch(os.path.basename(path)).groups()
    cfg = Config.fromfile(path)
    # the paper: AdamW, lr 1e-4, weight decay 0.05
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, tuple(opt.betas), opt.weight_decay) == \
        ('AdamW', 1e-4, (0.9, 0.999), 0.05)
    # 3x schedule: 36 epochs, lr x0.1 after epochs 27 and 33
    assert cfg.train_cfg.max_epochs == 36
    (step,) = [s for s in cfg.param_scheduler if s.type == 'MultiStepLR']
    assert (step.milestones, step.gamma, step.by_epoch) == ([27, 33], 0.1, True)
    # batch 16 = 8 GPUs x 2 images
    assert cfg.train_dataloader.batch_size * 8 == cfg.auto_scale_lr.base_batch_size == 16
    # DETR's multi-scale augmentation: shorter side 480..800 (or resize-crop-resize), <= 1333
    (choice,) = [t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomChoice']
    scales = [tuple(s) for s in choice.transforms[0][0].scales]
    assert scales == [(short, 1333) for short in range(480, 801, 32)]
    assert [t.type for t in choice.transforms[1]] == \
        ['RandomChoiceResize', 'RandomCrop', 'RandomChoiceResize']
    # the backbone named by the file, its ImageNet weights, and the FPN fed 4 x embed_dim
    backbone = cfg.model.backbone
    assert backbone.arch == f'{SIZES[model_tag]}_p{patch}'
    assert backbone.init_cfg == dict(type='Pretrained',
                                     checkpoint=f'checkpoints/xcit_{backbone.arch}_224.pth')
    assert cfg.model.neck.in_channels == [XCiT.arch_zoo[backbone.arch].embed_dim] * 4
    assert backbone.norm_cfg.type == 'SyncBN'
    assert cfg.default_hooks.checkpoint.max_keep_ckpts == 3
    # the header quotes the paper's numbers
    with open(path) as f:
        header = ''.join(f.readlines()[:3])
    box, mask = PAPER_AP[(model_tag, patch)]
    assert f'box AP {box}, mask AP {mask}' in header


# The optimizer settings come from the shared parent; two recipes cover both depths (12/24) and
# both patch embeddings (/16, /8) without building all eight models again.
@pytest.mark.parametrize('name', ['mask_rcnn_xcit_t12_16_3x.py', 'mask_rcnn_xcit_s24_8_3x.py'])
def test_weight_decay_groups(name):
    from mmengine.optim import build_optim_wrapper
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, name))
    model = _build(cfg)
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            assert names[id(p)] not in decay
            decay[names[id(p)]] = group['weight_decay']
    assert set(decay) == {n for n, p in model.named_parameters() if p.requires_grad}

    norm_types = (_BatchNorm, _InstanceNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)
    norm_params = {f'{m}.{n}' for m, mod in model.named_modules() if isinstance(mod, norm_types)
                   for n, _ in mod.named_parameters(recurse=False)}
    exempt = {n for n in decay
              if any(k in n for k in ('gamma', 'temperature', 'pos_embed')) or n in norm_params}
    assert {n: decay[n] for n in exempt if decay[n] != 0} == {}
    assert {n: decay[n] for n in set(decay) - exempt if decay[n] != 0.05} == {}
    # each exemption has something to act on
    for key in ('.gamma1', '.gamma2', '.gamma3', '.temperature', 'pos_embed', '.norm1.', '.bn.'):
        assert any(key in n for n in exempt), key
    assert decay['backbone.trunk.blocks.0.attn.qkv.weight'] == 0.05
    assert decay['backbone.trunk.blocks.0.mlp.fc1.weight'] == 0.05


def test_runner_reverts_syncbn_when_not_distributed(tmp_path):
    """The recipes ask for SyncBN; mmengine's Runner turns it into BN on one GPU or CPU."""
    from mmengine.runner import Runner
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, 'mask_rcnn_xcit_t12_16_3x.py'))
    cfg.model.backbone.init_cfg = None
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    modules = list(runner.model.modules())
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in modules)
    assert any(isinstance(m, _BatchNorm) for m in runner.model.backbone.modules())
    assert 'RNGStateHook' in [type(h).__name__ for h in runner.hooks]


def test_recipes_can_be_inherited_from_the_package(tmp_path):
    """`_base_ = 'deepvit_mm::configs/...'` resolves from the installed (or editable) package."""
    cfg_path = tmp_path / 'mine.py'
    cfg_path.write_text(textwrap.dedent("""
        _base_ = 'deepvit_mm::configs/mask_rcnn_xcit_s12_8_3x.py'
        model = dict(backbone=dict(drop_path_rate=0.0))
        """))
    cfg = Config.fromfile(str(cfg_path))
    assert cfg.model.backbone.arch == 'small_12_p8' and cfg.model.backbone.drop_path_rate == 0.0
