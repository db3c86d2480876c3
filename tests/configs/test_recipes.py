"""Every recipe trains what the official XCiT configs trained.

The official rules are written down here as data, each with the file it comes from
(facebookresearch/xcit at ``OFFICIAL_COMMIT``, mmdet 2.11 / mmseg 0.11 / mmcv 1.3), and applied
the way mmcv 1.3 applied them. The recipes' side is derived from their resolved configs and built
models through mmengine (its optimizer-wrapper constructor and parameter schedulers), so a change
anywhere between the two (a base, a key, a scheduler, mmengine itself) shows up as a difference.

What is compared, for every recipe under ``configs/`` (CaiT's and the Q/K/V variants' included):
- the weight decay of every parameter of the built model;
- the learning rate at every iteration of the whole schedule;
- drop path, optimizer, batch and precision.

The ViTDet and BEiT recipes are compared the same way with the configs they follow (detectron2's
projects/ViTDet, ``VITDET``; mmseg's configs/beit, ``BEIT``), their documented deviations spelled
out.
"""
import copy
import glob
import os
import re
from typing import Dict, List

import pytest
import torch
from conftest import CONFIG_DIR
from mmengine.config import Config

from deepvit_mm.apis import build_from_config, load_config
from deepvit_mm.engine import fit_precision_to_device

OFFICIAL_COMMIT = '9a7df94013b2945ec8532e2e4db32d03fc1ac297'
DET_FILE = 'detection/configs/xcit/mask_rcnn_xcit_{size}_p{patch}_3x_coco.py'
SEG_FILE = {
    'upernet': 'semantic_segmentation/configs/xcit/upernet/upernet_xcit_{size}_p{patch}_160k_ade20k.py',
    'sem_fpn': 'semantic_segmentation/configs/xcit/sem_fpn/sem_fpn_xcit_{size}_p{patch}_80k_ade20k.py',
}

# Swin's custom_keys, in every official XCiT config: `optimizer.paramwise_cfg.custom_keys`
OFFICIAL_NO_DECAY_KEYS = {'absolute_pos_embed': 0., 'relative_position_bias_table': 0., 'norm': 0.}

# What each task's official configs set (the per-model file plus the bases it names)
OFFICIAL = {
    # detection/configs/xcit/mask_rcnn_xcit_*_3x_coco.py; its lr_config.step and runner, over
    # detection/configs/_base_/schedules/schedule_1x.py's warm-up (linear, 500, 0.001);
    # optimizer_config use_fp16=True (apex O1: float16 autocast, dynamic loss scale)
    'mask_rcnn': dict(lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05, images_per_gpu=2, gpus=8,
                      warmup_iters=500, warmup_ratio=0.001, steps=(27, 33), gamma=0.1,
                      epochs=36, fp16=True),
    # semantic_segmentation/configs/xcit/upernet/*_160k_ade20k.py: lr_config poly (power 1,
    # min_lr 0, linear warm-up 1500 from 1e-6, by iteration) over schedule_160k.py's 160k
    'upernet': dict(lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01, images_per_gpu=2, gpus=8,
                    warmup_iters=1500, warmup_ratio=1e-6, power=1.0, min_lr=0., max_iters=160000,
                    fp16=False),
    # semantic_segmentation/configs/xcit/sem_fpn/*_80k_ade20k.py, the same over schedule_80k.py
    'sem_fpn': dict(lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01, images_per_gpu=2, gpus=8,
                    warmup_iters=1500, warmup_ratio=1e-6, power=1.0, min_lr=0., max_iters=80000,
                    fp16=False),
}
# backbone.drop_path_rate of each official file, by (task, size); sem_fpn M24 differs from the rest
OFFICIAL_DROP_PATH = {
    **{(task, size): dpr for task in ('mask_rcnn', 'upernet', 'sem_fpn')
       for size, dpr in (('tiny_12', 0.0), ('small_12', 0.05), ('small_24', 0.1),
                         ('medium_24', 0.15))},
    ('sem_fpn', 'medium_24'): 0.2,
}
SIZES = {'t12': 'tiny_12', 's12': 'small_12', 's24': 'small_24', 'm24': 'medium_24'}

# Our parameter names -> the official model's (the mmdet 2 -> 3 translation): timm's trunk keeps
# the official XCiT module names but for the Fourier encoding; ColumnarPyramid's levels are
# the official fpn1..fpn4; necks and heads are named as in mmdet 2.11 / mmseg 0.11.
XCIT_NAMES = [
    (r'^backbone\.trunk\.pos_embed\.', 'backbone.pos_embeder.'),
    (r'^backbone\.trunk\.', 'backbone.'),
    (r'^backbone\.adapter\.levels\.(\d)\.', lambda m: f'backbone.fpn{int(m[1]) + 1}.'),
]
# CaiT has no official detection/segmentation config: its recipes apply XCiT's, reading Swin's
# learned absolute position embedding (`absolute_pos_embed`) as CaiT's (`pos_embed`).
CAIT_NAMES = [(r'^backbone\.trunk\.pos_embed$', 'backbone.absolute_pos_embed')] + XCIT_NAMES[1:]
# F-SNE's codes: the non-linear Q/K/V paper's eq. 7 regularises the network weights only
PAPER_NO_DECAY = ('qkv_codes',)

ALL_RECIPES = sorted(p for p in glob.glob(os.path.join(CONFIG_DIR, '*.py')))
VITDET_RECIPES = [p for p in ALL_RECIPES if '_vitdet_' in os.path.basename(p)]
BEIT_RECIPES = [p for p in ALL_RECIPES if '_beit_' in os.path.basename(p)]
RECIPES = [p for p in ALL_RECIPES  # the official XCiT configs'
           if p not in VITDET_RECIPES and p not in BEIT_RECIPES]
NAME = re.compile(r'(mask_rcnn|upernet|sem_fpn)_(xcit|cait)_([a-z]+\d+)(?:_(8|16))?_')


def _official_file(recipe: str) -> str:
    """The official config a recipe translates (CaiT: the XCiT file of the same task, T12/16)."""
    task, family, model, patch = NAME.match(os.path.basename(recipe)).groups()
    size, patch = (SIZES[model], patch) if family == 'xcit' else ('tiny_12', '16')
    template = DET_FILE if task == 'mask_rcnn' else SEG_FILE[task]
    return template.format(size=size, patch=patch)


def _official_name(name: str, family: str) -> str:
    for pattern, repl in (XCIT_NAMES if family == 'xcit' else CAIT_NAMES):
        name = re.sub(pattern, repl, name)
    return name


def _official_decay(name: str, weight_decay: float) -> float:
    """mmcv 1.3's DefaultOptimizerConstructor with custom_keys: the longest key found in the
    parameter's full name sets its decay multiplier; the rest get the base weight decay."""
    for key in sorted(sorted(OFFICIAL_NO_DECAY_KEYS), key=len, reverse=True):
        if key in name:
            return weight_decay * OFFICIAL_NO_DECAY_KEYS[key]
    return weight_decay


def _task(recipe: str) -> str:
    return NAME.match(os.path.basename(recipe)).group(1)


def test_every_recipe_is_covered():
    assert len(RECIPES) >= 34 and VITDET_RECIPES and BEIT_RECIPES
    assert all(NAME.match(os.path.basename(p)) for p in RECIPES), [
        os.path.basename(p) for p in RECIPES if not NAME.match(os.path.basename(p))]


def _lr_and_decay(model: torch.nn.Module, cfg: Config) -> Dict[str, tuple]:
    """``{parameter name: (lr, weight_decay)}`` of the optimizer ``cfg.optim_wrapper`` builds for
    ``model`` (mmengine's constructor, as the Runner builds it)."""
    from mmengine.optim import build_optim_wrapper
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g['lr'], g['weight_decay'])
            for g in wrapper.optimizer.param_groups for p in g['params']}


@pytest.mark.parametrize('recipe', RECIPES, ids=os.path.basename)
@pytest.mark.slow
def test_weight_decay_of_every_parameter_is_the_official_one(recipe):
    """Every parameter's weight decay is what mmcv 1.3 gave it under the official config. Builds the
    recipe's full-size model on the meta device and mmengine's optimizer groups over it."""
    cfg = load_config(recipe)  # no GPU here: AmpOptimWrapper -> OptimWrapper, same groups
    official = OFFICIAL[_task(recipe)]
    family = cfg.model.backbone.type.lower()
    model = build_from_config(cfg, device='meta')[0]  # names and shapes only
    got = _lr_and_decay(model, cfg)
    assert set(got) == {n for n, p in model.named_parameters() if p.requires_grad}

    want = {}
    for name in got:
        if any(key in name for key in PAPER_NO_DECAY):
            want[name] = (official['lr'], 0.)
        else:
            want[name] = (official['lr'], _official_decay(_official_name(name, family),
                                                          official['weight_decay']))
    assert {n: (got[n], want[n]) for n in got if got[n] != want[n]} == {}, _official_file(recipe)
    # the rule acts on both sides: LayerNorms skip decay, BatchNorms, LayerScale and biases decay
    assert any(w == 0. for _, w in want.values())
    assert any(w > 0. for n, (_, w) in want.items() if n.endswith('.bias'))
    assert any(w > 0. for n, (_, w) in want.items() if re.search(r'\.(bn|1)\.weight$', n))


def _official_lr(task: str, it: int, epoch: int) -> float:
    """mmcv 1.3's LrUpdaterHook: the regular lr at iteration ``it`` (step policy: by epoch; poly:
    by iteration), times the linear warm-up factor while ``it < warmup_iters``."""
    o = OFFICIAL[task]
    if task == 'mask_rcnn':
        regular = o['lr'] * o['gamma'] ** sum(epoch >= s for s in o['steps'])
    else:
        coeff = (1 - it / o['max_iters']) ** o['power']
        regular = (o['lr'] - o['min_lr']) * coeff + o['min_lr']
    if it < o['warmup_iters']:
        k = (1 - it / o['warmup_iters']) * (1 - o['warmup_ratio'])
        return regular * (1 - k)
    return regular


def _mmengine_lrs(cfg: Config, iters_per_epoch: int) -> List[float]:
    """The lr of every iteration as mmengine's Runner would set it: the config's schedulers built
    as ``Runner.build_param_scheduler`` builds them, stepped by mmengine's ``ParamSchedulerHook``
    after every iteration and epoch."""
    from mmengine.hooks import ParamSchedulerHook
    from mmengine.optim import OptimWrapper
    from mmengine.registry import PARAM_SCHEDULERS

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=cfg.optim_wrapper.optimizer.lr)
    wrapper = OptimWrapper(optimizer)
    schedulers = [PARAM_SCHEDULERS.build(copy.deepcopy(s), default_args=dict(optimizer=wrapper))
                  for s in cfg.param_scheduler]

    class _Runner:  # what ParamSchedulerHook reads
        param_schedulers = schedulers
    hook, runner, lrs = ParamSchedulerHook(), _Runner(), []
    loop = cfg.train_cfg
    epochs = loop.get('max_epochs')
    total = epochs * iters_per_epoch if epochs else loop.max_iters
    for it in range(total):
        lrs.append(optimizer.param_groups[0]['lr'])
        hook.after_train_iter(runner, it)
        if epochs and (it + 1) % iters_per_epoch == 0:
            hook.after_train_epoch(runner)
    return lrs


_MISMATCHES: Dict[str, List[tuple]] = {}


@pytest.mark.parametrize('recipe', RECIPES, ids=os.path.basename)
@pytest.mark.slow
def test_lr_at_every_iteration_is_the_official_one(recipe):
    """The lr at every iteration is the official schedule's. Steps mmengine's schedulers through
    every iteration (263,880 for Mask R-CNN 3x, 160k/80k on ADE20k), once per schedule recipes
    share."""
    cfg = Config.fromfile(recipe)
    task = _task(recipe)
    # COCO train2017: 117,266 images with annotations / 16 a batch = 7,330 iterations an epoch
    iters_per_epoch = 7330 if task == 'mask_rcnn' else None
    key = repr((task, cfg.param_scheduler, cfg.train_cfg, cfg.optim_wrapper.optimizer.lr))
    if key not in _MISMATCHES:  # recipes sharing a schedule share one comparison
        lrs = _mmengine_lrs(cfg, iters_per_epoch)
        o = OFFICIAL[task]
        total = o['epochs'] * iters_per_epoch if task == 'mask_rcnn' else o['max_iters']
        assert len(lrs) == total
        # float rounding of mmengine's chained updates only: 1e-6 of the base lr, far below one
        # iteration's change (warm-up: >= 6.7e-4 of it; poly: 1 / max_iters >= 6e-6)
        _MISMATCHES[key] = [
            (it, lr, want) for it, lr in enumerate(lrs)
            if abs(lr - (want := _official_lr(task, it, it // (iters_per_epoch or total))))
            > 1e-6 * o['lr']]
    bad = _MISMATCHES[key]
    assert bad == [], (_official_file(recipe), bad[:5], len(bad))


@pytest.mark.parametrize('recipe', RECIPES, ids=os.path.basename)
@pytest.mark.slow
def test_drop_path_optimizer_batch_and_precision_are_the_official_ones(recipe, monkeypatch):
    """Drop path, AdamW settings, batch and precision are the official config's. Reads the recipe
    through its chain of bases with mmengine (and copies it for the fp16-on-a-GPU check)."""
    from deepvit_mm import CaiT, XCiT
    cfg = Config.fromfile(recipe)
    task, family, model_tag, _ = NAME.match(os.path.basename(recipe)).groups()
    o = OFFICIAL[task]
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, tuple(opt.betas), opt.weight_decay) == \
        ('AdamW', o['lr'], o['betas'], o['weight_decay'])
    assert cfg.train_dataloader.batch_size == o['images_per_gpu']
    assert cfg.auto_scale_lr.base_batch_size == o['images_per_gpu'] * o['gpus']
    backbone = cfg.model.backbone
    if family == 'xcit':
        dpr = backbone.get('drop_path_rate', XCiT.arch_zoo[backbone.arch].drop_path_rate)
        assert dpr == OFFICIAL_DROP_PATH[(task, SIZES[model_tag])], _official_file(recipe)
    else:  # CaiT: its own paper's Table 4 rate for the arch (no official dense-prediction file)
        assert backbone.get('drop_path_rate') is None
        assert CaiT.arch_zoo[backbone.arch].drop_path_rate > 0
    # float16 with dynamic loss scaling on a GPU where the official trained in fp16
    ow = cfg.optim_wrapper
    if o['fp16']:
        assert (ow.type, ow.loss_scale, ow.dtype) == ('AmpOptimWrapper', 'dynamic', 'float16')
        monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
        gpu = copy.deepcopy(cfg)
        assert fit_precision_to_device(gpu) is None and gpu.optim_wrapper.type == 'AmpOptimWrapper'
    else:
        assert ow.type == 'OptimWrapper'


# ------------------------------------------------------------------------------ ViTDet
# detectron2 projects/ViTDet/configs/COCO/mask_rcnn_vitdet_b_100ep.py over its common/ bases
# (optim.py AdamW, coco_schedule.py's 100-epoch multi-step with a 250-iteration linear warm-up
# from 0.001, train.py's amp): batch 64, 184,375 iterations, lr decay 0.7 over 12 blocks
# (get_vit_lr_decay_rate: patch and position embeddings layer 0, block i layer i + 1, the rest 13),
# weight decay 0.1 but 0 for norms (weight_decay_norm=0) and the position embedding (overrides).
VITDET = dict(lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1, decay_rate=0.7, num_layers=12,
              batch=64, max_iters=184375, warmup_iters=250, warmup_factor=0.001,
              milestones=(163889, 177546), gamma=0.1, drop_path=0.1, window_size=14,
              global_blocks=(2, 5, 8, 11), img_size=1024, fp16=True)


def _vitdet_layer(name: str) -> int:
    if 'pos_embed' in name or 'patch_embed' in name:
        return 0
    if '.blocks.' in name:
        return int(name[name.find('.blocks.'):].split('.')[2]) + 1
    return VITDET['num_layers'] + 1


def _vitdet_lr(it: int) -> float:
    """detectron2's WarmupParamScheduler(MultiStepParamScheduler, linear warm-up) at ``it``."""
    o = VITDET
    lr = o['lr'] * o['gamma'] ** sum(it >= m for m in o['milestones'])
    if it < o['warmup_iters']:
        alpha = it / o['warmup_iters']
        lr *= o['warmup_factor'] * (1 - alpha) + alpha
    return lr


@pytest.mark.parametrize('recipe', VITDET_RECIPES, ids=os.path.basename)
@pytest.mark.slow
def test_vitdet_recipe_is_vitdets(recipe):
    """The ViTDet recipe's lr, layer decay, weight decay and schedule are detectron2's. Builds
    ViT-B's Mask R-CNN on the meta device and steps mmengine's schedulers through all 184,375
    iterations."""
    cfg = load_config(recipe)
    o = VITDET
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, tuple(opt.betas), opt.weight_decay) == \
        ('AdamW', o['lr'], o['betas'], o['weight_decay'])
    assert cfg.train_dataloader.batch_size * 16 == cfg.auto_scale_lr.base_batch_size == o['batch']
    bb = cfg.model.backbone
    assert (bb.type, bb.drop_path_rate, bb.window_size, bb.img_size, bb.pyramid) == \
        ('TimmViT', o['drop_path'], o['window_size'], o['img_size'], 'simple')
    model = build_from_config(cfg, device='meta')[0]
    assert model.backbone.global_blocks == o['global_blocks']
    assert model.backbone.trunk.num_prefix_tokens == 0  # no class token
    # the lr and weight decay of every parameter
    got = _lr_and_decay(model, cfg)
    norms = {f'{m}.{n}' if m else n for m, mod in model.named_modules()
             if isinstance(mod, (torch.nn.LayerNorm, torch.nn.GroupNorm))
             for n, _ in mod.named_parameters(recurse=False)}
    want = {}
    for name in got:
        lr = o['lr'] * o['decay_rate'] ** (o['num_layers'] + 1 - _vitdet_layer(name))
        wd = 0. if name in norms or 'pos_embed' in name else o['weight_decay']
        want[name] = (pytest.approx(lr), wd)
    wrong = {n: (got[n], want[n]) for n in got if got[n] != want[n]}
    # the documented deviation: biases and the other 1-d parameters do not decay either
    deviation = {n for n in wrong if got[n][1] == 0. and (n.endswith('.bias'))}
    assert set(wrong) == deviation and deviation, sorted(set(wrong) - deviation)[:10]
    # the lr at every iteration
    raw = Config.fromfile(recipe)
    lrs = _mmengine_lrs(raw, None)
    assert len(lrs) == o['max_iters']
    bad = [(it, lr) for it, lr in enumerate(lrs) if abs(lr - _vitdet_lr(it)) > 1e-6 * o['lr']]
    assert bad == [], bad[:5]
    # fp16 on a GPU, as detectron2's amp
    ow = raw.optim_wrapper
    assert (ow.type, ow.loss_scale, ow.dtype) == ('AmpOptimWrapper', 'dynamic', 'float16')
    # the header quotes the paper's numbers
    with open(recipe) as f:
        assert 'box AP 51.6, mask AP 45.9' in f.read(2000)


# mmseg 1.x's configs/beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py over
# _base_/models/upernet_beit.py; its LearningRateDecayOptimizerConstructor (layer_wise): the class
# token, position and patch embeddings layer 0, block i layer i + 1, the rest 13, lr x 0.9 **
# (13 - layer); no weight decay for 1-d parameters, biases, pos_embed and cls_token.
BEIT = dict(lr=3e-5, betas=(0.9, 0.999), weight_decay=0.05, decay_rate=0.9, num_layers=12,
            batch=16, images_per_gpu=2, drop_path=0.1, img_size=640, crop=(640, 640),
            slide=dict(mode='slide', crop_size=(640, 640), stride=(426, 426)),
            decode_channels=768, aux=dict(channels=256, num_convs=1, in_index=2),
            param_scheduler=[
                dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
                dict(type='PolyLR', power=1.0, begin=1500, end=160000, eta_min=0.0,
                     by_epoch=False)],
            max_iters=160000)


def _beit_layer(name: str) -> int:
    if any(k in name for k in ('cls_token', 'pos_embed', 'patch_embed')):
        return 0
    if '.blocks.' in name:  # mmseg's backbone.layers.i
        return int(name[name.find('.blocks.'):].split('.')[2]) + 1
    return BEIT['num_layers'] + 1


@pytest.mark.parametrize('recipe', BEIT_RECIPES, ids=os.path.basename)
@pytest.mark.slow
def test_beit_recipe_is_mmsegs(recipe):
    """The BEiT recipe's optimizer, layer decay, schedule, crops and heads are mmseg's. Builds
    BEiT-B's UperNet on the meta device and mmengine's layer-decay groups over it."""
    cfg = load_config(recipe)
    o = BEIT
    opt = cfg.optim_wrapper.optimizer
    assert (cfg.optim_wrapper.type, opt.type, opt.lr, tuple(opt.betas), opt.weight_decay) == \
        ('OptimWrapper', 'AdamW', o['lr'], o['betas'], o['weight_decay'])
    assert cfg.train_dataloader.batch_size == o['images_per_gpu']
    assert cfg.auto_scale_lr.base_batch_size == o['batch']
    bb, head, aux = cfg.model.backbone, cfg.model.decode_head, cfg.model.auxiliary_head
    assert (bb.type, bb.drop_path_rate, bb.img_size) == ('TimmBEiT', o['drop_path'], o['img_size'])
    assert tuple(cfg.model.data_preprocessor.size) == o['crop']
    assert dict(cfg.model.test_cfg) == o['slide']
    assert head.channels == o['decode_channels']
    assert (aux.channels, aux.num_convs, aux.in_index) == tuple(o['aux'].values())
    assert [dict(s) for s in cfg.param_scheduler] == o['param_scheduler']
    assert cfg.train_cfg.max_iters == o['max_iters']
    crops = [t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomCrop']
    assert tuple(crops[0].crop_size) == o['crop']
    model = build_from_config(cfg, device='meta')[0]
    assert model.backbone.out_indices == (3, 5, 7, 11)
    got = _lr_and_decay(model, cfg)
    params = dict(model.named_parameters())
    want = {}
    for name in got:
        lr = o['lr'] * o['decay_rate'] ** (o['num_layers'] + 1 - _beit_layer(name))
        exempt = params[name].ndim == 1 or name.endswith('.bias') or \
            name.endswith(('.pos_embed', '.cls_token'))
        want[name] = (pytest.approx(lr), 0. if exempt else o['weight_decay'])
    wrong = {n: (got[n], want[n]) for n in got if got[n] != want[n]}
    # the documented deviation: the relative position bias tables do not decay (timm's
    # Beit.no_weight_decay)
    deviation = {n for n in wrong if n.endswith('relative_position_bias_table') and got[n][1] == 0.}
    assert set(wrong) == deviation and deviation, sorted(set(wrong) - deviation)[:10]
    with open(recipe) as f:
        assert 'mIoU 53.08' in f.read(2000)
