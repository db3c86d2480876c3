"""The ADE20k recipes (paper Table 6) carry the paper's settings and train as configured.

Building every config's model and checking the recipes' weight-decay groups is
tests/configs/test_configs.py's job (it globs configs/); this file checks what is specific to the
segmentation recipes.
"""
import os
import re

import pytest
import torch
from conftest import CONFIG_DIR, build_model, seg_inputs
from mmengine.config import Config

from deepvit_mm import XCiT

RECIPE = re.compile(r'(upernet|sem_fpn)_xcit_([a-z]\d+)_(8|16)_(160k|80k)_ade20k\.py')
SEG_RECIPES = sorted(os.path.join(CONFIG_DIR, n) for n in os.listdir(CONFIG_DIR)
                     if RECIPE.fullmatch(n))
# Table 6: mIoU (single-scale, ADE20k val) of Semantic FPN 80k and UperNet 160k
PAPER_MIOU = {('t12', '16'): (38.1, 41.5), ('t12', '8'): (39.9, 43.5),
              ('s12', '16'): (43.9, 45.9), ('s12', '8'): (44.2, 46.6),
              ('s24', '16'): (44.6, 46.9), ('s24', '8'): (47.1, 48.1),
              ('m24', '16'): (45.9, 47.6), ('m24', '8'): (46.9, 48.4)}
SIZES = {'t12': 'tiny_12', 's12': 'small_12', 's24': 'small_24', 'm24': 'medium_24'}


def _ids(paths):
    return [os.path.basename(p) for p in paths]


def test_recipes_cover_table6():
    found = {(m.group(1), m.group(2), m.group(3))
             for m in (RECIPE.fullmatch(os.path.basename(p)) for p in SEG_RECIPES)}
    want = {(head, *key) for key in PAPER_MIOU for head in ('upernet', 'sem_fpn')}
    assert want <= found
    # the schedule is part of the name: UperNet 160k, Semantic FPN 80k
    for p in SEG_RECIPES:
        m = RECIPE.fullmatch(os.path.basename(p))
        assert m.group(4) == {'upernet': '160k', 'sem_fpn': '80k'}[m.group(1)]


@pytest.mark.parametrize('path', SEG_RECIPES, ids=_ids(SEG_RECIPES))
@pytest.mark.slow
def test_segmentation_recipe_hyper_parameters(path):
    """An ADE20k recipe carries the paper's optimizer, schedule, batch, data, backbone, heads and
    mIoU. Reads the recipe through its chain of bases with mmengine."""
    head, model_tag, patch, sched = RECIPE.fullmatch(os.path.basename(path)).groups()
    cfg = Config.fromfile(path)
    assert cfg.default_scope == 'mmseg'
    assert 'deepvit_mm' in cfg.custom_imports['imports']
    # the paper: AdamW, lr 6e-5, weight decay 0.01
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, tuple(opt.betas), opt.weight_decay) == \
        ('AdamW', 6e-5, (0.9, 0.999), 0.01)
    assert cfg.optim_wrapper.type == 'OptimWrapper'  # no SGD/momentum left from the base
    # 160k (UperNet) / 80k (Semantic FPN) iterations; a 1500-iteration warm-up times a linear
    # decay over the whole run (mmcv 1.x's poly with warm-up; mmengine reaches `end` at end - 1,
    # the per-iteration values are tests/configs/test_recipes.py's)
    iters = {'160k': 160000, '80k': 80000}[sched]
    assert (cfg.train_cfg.type, cfg.train_cfg.max_iters) == ('IterBasedTrainLoop', iters)
    warm, poly = cfg.param_scheduler
    assert (warm.type, warm.start_factor, warm.begin, warm.end) == ('LinearLR', 1e-6, 0, 1501)
    assert (poly.type, poly.power, poly.eta_min, poly.begin, poly.end) == \
        ('PolyLR', 1.0, 0.0, 0, iters + 1)
    assert not warm.by_epoch and not poly.by_epoch
    # batch 16 = 8 GPUs x 2 images
    assert cfg.train_dataloader.batch_size * 8 == cfg.auto_scale_lr.base_batch_size == 16
    # ADE20k, 512x512 crops, 150 classes, single-scale whole-image evaluation
    ds = cfg.train_dataloader.dataset
    assert ds.type == 'ADE20KDataset' and ds.data_root == 'data/ade/ADEChallengeData2016'
    assert cfg.model.data_preprocessor.size == (512, 512)
    crop = [t for t in ds.pipeline if t.type == 'RandomCrop']
    assert crop and tuple(crop[0].crop_size) == (512, 512)
    test_types = [t.type for t in cfg.test_dataloader.dataset.pipeline]
    assert test_types == ['LoadImageFromFile', 'Resize', 'LoadAnnotations', 'PackSegInputs']
    assert cfg.test_dataloader.dataset.pipeline[1].scale == (2048, 512)
    assert cfg.model.test_cfg.mode == 'whole'
    assert cfg.val_evaluator.iou_metrics == ['mIoU']
    # the backbone named by the file, its ImageNet weights, SyncBN, the official unpadded input
    backbone = cfg.model.backbone
    assert backbone.type == 'XCiT' and backbone.arch == f'{SIZES[model_tag]}_p{patch}'
    assert backbone.init_cfg == dict(
        type='Pretrained', checkpoint=f'https://dl.fbaipublicfiles.com/xcit/xcit_{backbone.arch}_224.pth')
    assert cfg.model.pretrained is None
    assert backbone.norm_cfg.type == 'SyncBN' and backbone.pad_input is False
    dim = XCiT.arch_zoo[backbone.arch].embed_dim
    dh = cfg.model.decode_head
    assert dh.num_classes == 150
    if head == 'upernet':
        assert (dh.type, dh.in_channels, dh.channels) == ('UPerHead', [dim] * 4, 512)
        aux = cfg.model.auxiliary_head
        assert (aux.type, aux.in_channels, aux.in_index, aux.num_classes) == \
            ('FCNHead', dim, 2, 150)
    else:
        # the official code's FPN keeps embed_dim channels; Semantic FPN head with 128
        assert (cfg.model.neck.type, cfg.model.neck.in_channels, cfg.model.neck.out_channels) \
            == ('FPN', [dim] * 4, dim)
        assert (dh.type, dh.in_channels, dh.channels, dh.feature_strides) == \
            ('FPNHead', [dim] * 4, 128, [4, 8, 16, 32])
    assert cfg.default_hooks.checkpoint.max_keep_ckpts == 3
    # the header quotes the paper's number
    with open(path) as f:
        header = ''.join(f.readlines()[:3])
    fpn_miou, uper_miou = PAPER_MIOU[(model_tag, patch)]
    want = uper_miou if head == 'upernet' else fpn_miou
    assert f'mIoU {want}' in header


# XCiT inside mmseg's own base configs is tests/models/test_integration.py's; these are our recipes
# (their necks and head wiring), with the smallest backbone of the table and small inputs.
@pytest.mark.parametrize('name', ['upernet_xcit_t12_16_160k_ade20k.py',
                                  'sem_fpn_xcit_t12_16_80k_ade20k.py'])
@pytest.mark.slow
def test_recipe_loss_backward_and_unpadded_predict(name):
    """A segmentation recipe's model: loss, backward and an unpadded prediction. ~2-8 s: the
    recipe's model at full width."""
    cfg = Config.fromfile(os.path.join(CONFIG_DIR, name))
    cfg.model.data_preprocessor.size = None  # the base pads every batch to 512x512 crops
    cfg.model.data_preprocessor.size_divisor = 32
    model = build_model(cfg).train()
    data = model.data_preprocessor(seg_inputs(), True)
    losses = model(**data, mode='loss')
    loss, log_vars = model.parse_losses(losses)
    assert torch.isfinite(loss)
    assert {'decode.loss_ce'} <= set(log_vars)
    if name.startswith('upernet'):
        assert 'aux.loss_ce' in log_vars
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    no_grad = [n for n, g in grads.items() if g is None]
    assert no_grad == []
    assert all(torch.isfinite(g).all() for g in grads.values())
    # whole-image inference on an unpadded, not-multiple-of-32 image (pad_input=False)
    model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(seg_inputs(batch=1, h=70, w=100), False)
        (pred,) = model(**data, mode='predict')
    assert pred.pred_sem_seg.data.shape == (1, 70, 100)
