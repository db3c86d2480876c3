"""Stock mmdet 3.x and mmseg 1.x architectures, each with an XCiT and with a CaiT backbone.

Each case inherits the config mmdet or mmseg ship in their installed package (``_base_ =
'mmdet::...'``, not a copy) and changes only what a user would: the backbone (and, for 3-level or
2-level necks and heads, its ``out_strides``), the channels and levels the neck or heads read,
mmseg's ``pretrained=None``. The data is replaced by small generated data (and with it the crop
size the data preprocessor pads to). Each case trains two iterations with the config's own
optimizer (finite losses, a finite gradient for every trainable backbone parameter at the first,
weights changed) and predicts in test mode. docs/architectures.md has the table of these cases.

Then: the levels a backbone feeds are available from Python (``feature_levels``), 3 levels default
to the paper's taps of their strides, and a neck or head built for other channels or levels is
refused before anything runs (by ``build_from_config`` and by ``CheckConsumersHook`` before a
Runner's run) with a message naming the config keys to set; the forward itself does not check.
"""
import re
from types import SimpleNamespace
from typing import NamedTuple, Optional

import pytest
import torch
from conftest import DEMO_DET, EARLY, build_model, config_from_text, family_archs, seg_inputs

import deepvit_mm.models.utils.consumers as consumers
from deepvit_mm import CaiT, CheckConsumersHook, ColumnarBackbone, TimmViT, XCiT
from deepvit_mm.models.utils.consumers import ChannelMismatchError, check_consumers, check_model
from deepvit_mm.utils import meta_device

# the smallest arch of each family: XCiT with the paper's taps (12 blocks of 128 channels);
# CaiT pruned to its first blocks (conftest.EARLY), one tap per level; timm's ViT as timm's tests
# build it (test_vit: 6 blocks of 64 channels) with ViTDet's simple pyramid (every level from
# its last block)
BACKBONES = {
    'XCiT': lambda n: f"dict(_delete_=True, type='XCiT', arch='nano_12_p16', "
                      f'out_strides={STRIDES[n]})',
    'CaiT': lambda n: f"dict(_delete_=True, type='CaiT', arch='xxs24', out_strides={STRIDES[n]}, "
                      f'out_indices={EARLY[-len(STRIDES[n]):]})',
    'TimmViT': lambda n: f"dict(_delete_=True, type='TimmViT', arch='test_vit', "
                         f"out_strides={STRIDES[n]}, pyramid='simple')",
}
CHANNELS = {'XCiT': XCiT.feature_levels('nano_12_p16').channels[0],
            'CaiT': CaiT.feature_levels('xxs24').channels[0],
            'TimmViT': TimmViT.feature_levels('test_vit').channels[0]}
# timm's families share XCiT's and CaiT's code from the taps on: one of them, with the other
# adapter, through a two-stage, a one-stage and a DETR-like detector and two segmentors
TIMM_ARCHS = ('faster_rcnn', 'retinanet', 'dino', 'upernet', 'mask2former_semantic')
STRIDES = {4: (4, 8, 16, 32), 3: (8, 16, 32), 2: (16, 32), 1: (8,), -3: (4, 16, 32)}
SIZE = 64  # the crop size of the generated data


class Arch(NamedTuple):
    """A stock architecture and what a user changes in it.

    Attributes:
        id (str): The test id.
        base (str): The installed config (``mmdet::``/``mmseg::`` path).
        levels (int): The backbone's ``out_strides`` (``STRIDES``): 4 -> 4/8/16/32, 3 -> 8/16/32,
            2 -> 16/32, 1 -> 8, -3 -> 4/16/32 (the levels the neck or heads read: every parameter of the
            backbone then gets a gradient, as DistributedDataParallel requires).
        changes (str): The config's ``model`` entries besides the backbone (``{C}``: the
            backbone's channels), or the config's text after ``_base_`` with ``{backbone}``.
        small (dict, optional): Settings lowered for the generated data's 64 px images only (a
            user training at the stock sizes keeps them), as ``--cfg-options`` gives them.
    """
    id: str
    base: str
    levels: int
    changes: str
    small: Optional[dict] = None


# Mask2Former samples 112 x 112 points of every mask (sized for 512-1024 px crops); a 64 px
# crop's masks have 16 x 16 at the head's stride 4
M2F_POINTS = 16 * 16


# The RoI heads train on 512 RoIs an image (sized for 800 px images); a 64 px image with 2-3
# objects has them in 64 (mmcv's RoIAlign backward on the CPU took 2.7 s a step for 512)
ROIS = 64


ARCHS = [
    # ---------------------------------------------------------------- mmdet: two-stage
    Arch('faster_rcnn', 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', 4,
         'neck=dict(in_channels=[{C}] * 4)', small={'model.train_cfg.rcnn.sampler.num': ROIS}),
    Arch('cascade_rcnn', 'mmdet::cascade_rcnn/cascade-rcnn_r50_fpn_1x_coco.py', 4,
         'neck=dict(in_channels=[{C}] * 4)',
         small={f'model.train_cfg.rcnn.{i}.sampler.num': ROIS for i in range(3)}),
    # ---------------------------------------------------------------- mmdet: one-stage
    # their FPN reads levels 1-3 of 4 (start_level=1): fed 3 levels, it starts at 0
    Arch('retinanet', 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', 3,
         'neck=dict(in_channels=[{C}] * 3, start_level=0)'),
    Arch('fcos', 'mmdet::fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py', 3,
         'neck=dict(in_channels=[{C}] * 3, start_level=0)'),
    Arch('atss', 'mmdet::atss/atss_r50_fpn_1x_coco.py', 3,
         'neck=dict(in_channels=[{C}] * 3, start_level=0)'),
    # ---------------------------------------------------------------- mmdet: DETR-like
    # ChannelMapper reads 3 levels and makes the 4th (num_feature_levels=4 stays)
    Arch('deformable_detr', 'mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py', 3,
         'neck=dict(in_channels=[{C}] * 3)'),
    # its two-stage proposals are the top num_queries of the encoder's tokens (85 at 64 px)
    Arch('dino', 'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', 3,
         'neck=dict(in_channels=[{C}] * 3)', small={'model.num_queries': 50}),
    # ---------------------------------------------------------------- mmdet: masks, panoptic
    Arch('mask2former_instance', 'mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py', 4,
         'panoptic_head=dict(in_channels=[{C}] * 4)', small={'model.train_cfg.num_points': M2F_POINTS}),
    Arch('panoptic_fpn', 'mmdet::panoptic_fpn/panoptic-fpn_r50_fpn_1x_coco.py', 4,
         'neck=dict(in_channels=[{C}] * 4)', small={'model.train_cfg.rcnn.sampler.num': ROIS}),
    Arch('mask2former_panoptic',
         'mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco-panoptic.py', 4,
         'panoptic_head=dict(in_channels=[{C}] * 4)', small={'model.train_cfg.num_points': M2F_POINTS}),
    # ---------------------------------------------------------------- mmseg
    Arch('upernet', 'mmseg::upernet/upernet_r50_4xb4-80k_ade20k-512x512.py', 4,
         'pretrained=None, decode_head=dict(in_channels=[{C}] * 4), '
         'auxiliary_head=dict(in_channels={C})'),
    # the dilated-ResNet heads read levels 2 and 3 (in_index): fed 2 levels, 0 and 1
    Arch('pspnet', 'mmseg::pspnet/pspnet_r50-d8_4xb4-80k_ade20k-512x512.py', 2,
         'pretrained=None, decode_head=dict(in_channels={C}, in_index=1), '
         'auxiliary_head=dict(in_channels={C}, in_index=0)'),
    Arch('fcn', 'mmseg::fcn/fcn_r50-d8_4xb4-80k_ade20k-512x512.py', 2,
         'pretrained=None, decode_head=dict(in_channels={C}, in_index=1), '
         'auxiliary_head=dict(in_channels={C}, in_index=0)'),
    # DeepLabV3+ also reads level 0 (c1, stride 4): levels at strides 4, 16, 32
    Arch('deeplabv3plus', 'mmseg::deeplabv3plus/deeplabv3plus_r50-d8_4xb4-80k_ade20k-512x512.py', -3,
         'pretrained=None, decode_head=dict(in_channels={C}, in_index=2, c1_in_channels={C}), '
         'auxiliary_head=dict(in_channels={C}, in_index=1)'),
    Arch('segformer_head', 'mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py', 4,
         'decode_head=dict(in_channels=[{C}] * 4)'),
    # a cascade: decode_head is a list, updated in place from the base's; the OCR head gathers
    # the FCN head's class map over its own input, so both read one level (a dilated ResNet's two
    # are both at stride 8)
    Arch('ocrnet', 'mmseg::ocrnet/ocrnet_r101-d8_4xb2-40k_cityscapes-512x1024.py', 1, """
        decode_head = _base_.model.decode_head
        decode_head[0].update(in_channels={C}, in_index=0)
        decode_head[1].update(in_channels={C}, in_index=0)
        model = dict(pretrained=None, backbone={backbone}, decode_head=decode_head)
        """),
    Arch('knet_upernet', 'mmseg::knet/knet-s3_r50-d8_upernet_8xb2-adamw-80k_ade20k-512x512.py', 4,
         'pretrained=None, decode_head=dict(kernel_generate_head=dict(in_channels=[{C}] * 4)), '
         'auxiliary_head=dict(in_channels={C})'),
    Arch('mask2former_semantic', 'mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py', 4,
         'decode_head=dict(in_channels=[{C}] * 4)',
         small={'model.decode_head.train_cfg.num_points': M2F_POINTS}),
]
CASES = [pytest.param(arch, fam, id=f'{arch.id}-{fam}') for arch in ARCHS for fam in BACKBONES
         if not fam.startswith('Timm') or arch.id in TIMM_ARCHS]


def arch_config(tmp_path, arch: Arch, family: str, data_size: int = SIZE):
    """``arch``'s config with ``family``'s backbone, as a user writes it, and the generated data's
    crop size (mmseg's ``data_preprocessor.size``, Mask2Former's fixed-size pad)."""
    backbone, channels = BACKBONES[family](arch.levels), CHANNELS[family]
    if '{backbone}' in arch.changes:
        body = arch.changes
    else:
        body = f'model = dict(backbone={{backbone}}, {arch.changes})'
    body = body.format(backbone=backbone, C=channels)
    cfg = config_from_text(tmp_path, f"_base_ = '{arch.base}'\n"
                                     "custom_imports = dict(imports=['deepvit_mm'])\n"
                                     + _dedent(body))
    cfg.merge_from_dict(arch.small or {})
    pre = cfg.model.data_preprocessor
    if cfg.default_scope == 'mmseg':
        pre.size = (data_size, data_size)
    for aug in pre.get('batch_augments') or []:
        aug.size = (data_size, data_size)
    return cfg


def _dedent(text: str) -> str:
    import textwrap
    return textwrap.dedent(text).strip() + '\n'


def generated_data(cfg, model, train: bool) -> dict:
    """A dataloader's batch for ``cfg``'s task: two training images or one test image."""
    if cfg.default_scope == 'mmseg':
        heads = model.decode_head  # a cascade's (OCRNet) is a list: its last head predicts
        classes = (heads[-1] if isinstance(heads, torch.nn.ModuleList) else heads).num_classes
        return seg_inputs(2, SIZE, SIZE, classes) if train else seg_inputs(1, 48, 80, classes)
    from mmdet.testing import demo_mm_inputs
    panoptic = 'panoptic' in cfg.model.type.lower() or \
        cfg.model.get('test_cfg', {}).get('panoptic_on', False)
    shapes = [(3, SIZE, SIZE), (3, 48, SIZE)] if train else [(3, 56, 72)]
    return demo_mm_inputs(len(shapes), shapes, num_items=[3, 2][:len(shapes)], num_classes=80,
                          with_mask=True, with_semantic=panoptic)


def train_two_steps(cfg, model) -> None:
    """Two training steps with the config's optimizer: finite losses, a finite gradient for every
    trainable backbone parameter at the first step, the backbone's and the heads' weights changed."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items() if p.requires_grad}
    grads = {}

    def record(name):
        def hook(param):
            grads.setdefault(name, bool(torch.isfinite(param.grad).all()))
        return hook
    hooks = [p.register_post_accumulate_grad_hook(record(n))
             for n, p in params.items() if n.startswith('backbone.') and p.requires_grad]
    model.train()
    data = generated_data(cfg, model, train=True)
    for step in range(2):
        log_vars = model.train_step(data, optim_wrapper)
        assert torch.isfinite(log_vars['loss']), (step, log_vars)
        if step == 0:
            for h in hooks:
                h.remove()
    backbone = [n for n in before if n.startswith('backbone.')]
    assert sorted(grads) == sorted(backbone) and all(grads.values())
    changed = {n for n, p in before.items() if not torch.equal(p, params[n].detach())}
    assert changed & set(backbone) and changed - set(backbone)


def predict(cfg, model) -> list:
    """One test-mode prediction of a generated image, checked for the task's outputs."""
    model.eval()
    with torch.no_grad():
        (result,) = model.test_step(generated_data(cfg, model, train=False))
    if cfg.default_scope == 'mmseg':
        assert tuple(result.pred_sem_seg.data.shape[-2:]) == (48, 80)
    elif 'pred_panoptic_seg' in result:
        assert tuple(result.pred_panoptic_seg.sem_seg.shape[-2:]) == (56, 72)
    else:
        boxes = result.pred_instances.bboxes
        assert boxes.shape[-1] == 4 and torch.isfinite(boxes).all()
    return result


@pytest.fixture
def mmcv_ext_calls(monkeypatch):
    """The names of mmcv's compiled functions (``mmcv._ext``) called during a test."""
    import mmcv._ext as ext
    calls = set()

    def recording(name, fn):
        def call(*args, **kwargs):
            calls.add(name)
            return fn(*args, **kwargs)
        return call
    for name in dir(ext):
        if not name.startswith(('_', 'get_compil')) and callable(getattr(ext, name)):
            monkeypatch.setattr(ext, name, recording(name, getattr(ext, name)))
    return calls


@pytest.mark.parametrize('arch,family', CASES)
@pytest.mark.slow
def test_stock_architecture_trains_and_predicts(tmp_path, arch, family, mmcv_ext_calls):
    """Two training steps and a prediction of a stock architecture with the backbone. Up to ~30 s
    for the DETR-like ones (six-layer encoders and decoders at 256 channels), ~2-10 s for the
    others. Every mmcv compiled op that ran is among those ``mmcv_ops_used`` finds in the model
    before it runs (tools/train.py stops a GPU run of them beside an mmcv built for the CPU); it
    finds more than run here where an op's CPU path is PyTorch's (MultiScaleDeformableAttention)
    or no box passed the score threshold (nms)."""
    from deepvit_mm.engine.mmcv_ops import mmcv_ops_used
    cfg = arch_config(tmp_path, arch, family)
    model = build_model(cfg)
    assert type(model.backbone).__name__ == family
    found = mmcv_ops_used(model)
    train_two_steps(cfg, model)
    predict(cfg, model)
    ran_nms = {c for c in mmcv_ext_calls if 'nms' in c}
    assert 'nms' in found or not ran_nms, (found, sorted(mmcv_ext_calls))
    assert set(found) - {'nms'} or not mmcv_ext_calls - ran_nms, (found, sorted(mmcv_ext_calls))


# ------------------------------------------------------------------------------ the levels fed
FAMILIES = {fam.__name__: fam for fam in ColumnarBackbone.families}
ALL_ARCHS = [(name, arch) for name, fam in FAMILIES.items() for arch in family_archs(fam)]


@pytest.mark.parametrize('family,arch', ALL_ARCHS, ids=[f'{f}-{a}' for f, a in ALL_ARCHS])
def test_feature_levels_per_arch(family, arch):
    fam = FAMILIES[family]
    spec = fam.arch_zoo[arch]
    levels = fam.feature_levels(spec.timm or arch)  # timm's name or the short one
    assert levels == ([spec.embed_dim] * 4, (4, 8, 16, 32), tuple(spec.out_indices))
    # fewer levels: the paper's taps of those strides
    for strides in [(8, 16, 32), (16, 32), (32,), (4, 16, 32)]:
        levels = fam.feature_levels(arch, strides)
        taps = tuple(spec.out_indices[(4, 8, 16, 32).index(s)] for s in strides)
        assert levels == ([spec.embed_dim] * len(strides), strides, taps)
        assert fam.default_out_indices(arch, strides) == taps


@pytest.mark.parametrize('family,arch', [('XCiT', 'nano_12_p16'), ('XCiT', 'nano_12_p8'),
                                         ('CaiT', 'xxs24')])
@pytest.mark.parametrize('strides', [(8, 16, 32), (16, 32)], ids=str)
def test_fewer_levels_alone_build_with_the_papers_taps(family, arch, strides):
    fam = FAMILIES[family]
    model = fam(arch, out_strides=strides)
    levels = fam.feature_levels(arch, strides)
    assert (model.out_indices, list(model.out_channels), model.out_strides) == \
        (levels.out_indices, levels.channels, levels.strides)
    outs = model(torch.randn(1, 3, 64, 96))
    assert [tuple(o.shape) for o in outs] == \
        [(1, levels.channels[0], 64 // s, 96 // s) for s in strides]


@pytest.mark.parametrize('family', list(FAMILIES))
@pytest.mark.parametrize('pyramid', ['columnar', 'simple'])
def test_feature_levels_are_what_the_backbone_built_feeds(family, pyramid):
    """``feature_levels`` with a pyramid's arguments against the backbone built with them: its
    taps, channels and strides, and the maps its forward returns (built on the meta device)."""
    fam = FAMILIES[family]
    arch = family_archs(fam)[0]
    for strides in [(4, 8, 16, 32), (8, 16, 32)]:
        levels = fam.feature_levels(arch, strides, pyramid=pyramid)
        with meta_device():
            model = fam(arch, out_strides=strides, pyramid=pyramid).eval()
            outs = model(torch.empty(1, 3, 224, 224))  # BEiT's own size (it pads to it)
        assert (model.out_indices, list(model.out_channels), model.out_strides) == \
            (levels.out_indices, levels.channels, levels.strides)
        assert [tuple(o.shape) for o in outs] == [(1, c, 224 // s, 224 // s) for c, s in zip(
            levels.channels, levels.strides)]
    depth = fam.arch_zoo[arch].depth
    assert (levels.out_indices == (depth - 1,)) == (pyramid == 'simple')
    with pytest.raises(ValueError, match="pyramid='vitdet' must be 'columnar'"):
        fam.feature_levels(arch, pyramid='vitdet')


@pytest.mark.parametrize('strides', [(8, 16, 64), (32, 16, 8), (8, 8)], ids=str)
def test_strides_without_default_taps_ask_for_out_indices(strides):
    with pytest.raises(ValueError, match='give out_indices'):
        XCiT('nano_12_p16', out_strides=strides)


# ------------------------------------------------------------------------------ wrong channels
# a stock config with the backbone swapped and nothing else: the channels of a ResNet-50
# (case, the fix the message names, the backbone's levels, the step run unchecked: training or test)
MISMATCHES = [
    ('faster_rcnn', 'model.neck.in_channels=[{C}, {C}, {C}, {C}]', 4, 'loss'),
    ('dino', 'out_strides=(8, 16, 32)', 4, 'predict'),  # 3-level ChannelMapper fed 4 levels
    ('mask2former_instance', 'model.panoptic_head.in_channels=[{C}, {C}, {C}, {C}]', 4, 'loss'),
    ('upernet', 'model.auxiliary_head.in_channels={C}', 4, 'predict'),
    ('deeplabv3plus', 'model.decode_head.c1_in_channels={C}', 4, 'loss'),
    ('knet_upernet', 'model.decode_head.kernel_generate_head.in_channels=[{C}, {C}, {C}, {C}]', 4,
     'predict'),
    ('mask2former_semantic', 'model.decode_head.in_channels=[{C}, {C}, {C}, {C}]', 4, 'loss'),
    ('pspnet', 'model.decode_head.in_index to levels that exist', 2, 'predict'),  # 3 of 2 levels
]
# what a mismatched neck or head raises itself in its forward: a convolution's shape error, an
# assertion on the number of levels, an index past the levels
OWN_ERRORS = (RuntimeError, AssertionError, IndexError)


def build_unchecked(cfg) -> torch.nn.Module:
    """``build_model`` without the consumer check, as code other than ``build_from_config``
    builds a model (mmengine's Runner, mmdet's ``init_detector``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(consumers, 'check_consumers', lambda *a: None)
        return build_model(cfg)


def mismatch_message(cfg, unchecked: torch.nn.Module) -> str:
    """The ``ChannelMismatchError`` of both entry points, which say the same: building ``cfg``
    with ``build_from_config``, and ``CheckConsumersHook.before_run`` on a runner holding
    ``unchecked`` (``cfg``'s model built without the check; the hook reads only
    ``runner.model``)."""
    with pytest.raises(ChannelMismatchError) as built:
        build_model(cfg)
    with pytest.raises(ChannelMismatchError) as hooked:
        CheckConsumersHook().before_run(SimpleNamespace(model=unchecked))
    assert str(hooked.value) == str(built.value)
    return str(built.value)


@pytest.mark.parametrize('arch_id,fix,levels,mode', MISMATCHES,
                         ids=[f'{m[0]}-{m[3]}' for m in MISMATCHES])
@pytest.mark.slow
def test_consumer_built_for_other_channels_fails_naming_the_fix(tmp_path, arch_id, fix, levels,
                                                                 mode):
    """A stock config with only the backbone swapped is refused by ``build_from_config`` and the
    hook, naming the key to set; unchecked, its step fails in the neck or head. Builds the stock
    model twice (DINO and Mask2Former among them), then runs the failing step."""
    arch = next(a for a in ARCHS if a.id == arch_id)
    stock = arch._replace(levels=levels, changes='')  # build_model drops mmseg's pretrained
    cfg = arch_config(tmp_path, stock, 'XCiT')
    model = build_unchecked(cfg)  # builds: the neck and heads do not know the backbone
    message = mismatch_message(cfg, model)
    channels = list(model.backbone.out_channels)
    assert f'XCiT(arch=\'nano_12_p16\') feeds {levels} levels of {channels} channels' in message
    assert fix.format(C=CHANNELS['XCiT']) in message
    # the forward does not check: unchecked, the step fails inside the neck or head
    data = model.data_preprocessor(generated_data(cfg, model, train=mode == 'loss'), mode == 'loss')
    with pytest.raises(OWN_ERRORS) as err:
        model.train(mode == 'loss')(**data, mode=mode)
    assert not isinstance(err.value, ChannelMismatchError)


def test_cascade_heads_at_two_strides_fail_naming_the_fix(tmp_path):
    """OCRNet's OCR head gathers the FCN head's class map over its own input: heads given two
    strides (channels right) are refused with the in_index to set; unchecked, the step fails
    inside mmseg's gather."""
    ocrnet = next(a for a in ARCHS if a.id == 'ocrnet')
    two = ocrnet._replace(levels=2, changes=ocrnet.changes.replace(
        'decode_head[0].update(in_channels={C}, in_index=0)',
        'decode_head[0].update(in_channels={C}, in_index=1)'))
    cfg = arch_config(tmp_path, two, 'XCiT')
    model = build_unchecked(cfg)
    message = mismatch_message(cfg, model)
    assert 'model.decode_head[1] (OCRHead) gathers model.decode_head[0]\'s class map (in_index=1, ' \
        'stride 32) over its own input (in_index=0, stride 16)' in message
    assert 'Set model.decode_head[1].in_index=1' in message
    data = model.data_preprocessor(generated_data(cfg, model, train=True), True)
    with pytest.raises(RuntimeError, match='Expected size for first two dimensions'):
        model.train()(**data, mode='loss')


@pytest.mark.slow
def test_a_runner_stops_before_the_first_iteration(tmp_path, shapes):
    """``tools/train.py``'s path: mmengine's Runner builds the model without the check, and the
    recipes' ``CheckConsumersHook`` refuses it before any iteration."""
    from mmengine.config import Config
    from mmengine.runner import Runner
    cfg = Config.fromfile(DEMO_DET)
    cfg.merge_from_dict({
        'model.neck.in_channels': [256, 512, 1024, 2048],  # a ResNet-50's
        'train_dataloader.dataset.data_root': f'{shapes}/', 'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'val_cfg': None, 'val_dataloader': None, 'val_evaluator': None})
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    steps = []
    runner.model.backbone.register_forward_pre_hook(lambda *a: steps.append(a))
    with pytest.raises(ChannelMismatchError, match=re.escape(
            'model.neck (FPN): in_channels=[256, 512, 1024, 2048]. '
            'Set model.neck.in_channels=[128, 128, 128, 128].')):
        runner.train()
    assert steps == [] and runner.iter == 0


def test_a_wrapped_model_is_checked_inside(tmp_path, monkeypatch):
    """``runner.model`` of a distributed run is in a model wrapper, and of ``tools/test.py --tta``
    in a test-time augmentation model: the hook checks the segmentor inside both."""
    from mmengine.registry import MODEL_WRAPPERS
    from mmseg.models import SegTTAModel

    class Wrapper(torch.nn.Module):  # as MMDistributedDataParallel holds the model
        def __init__(self, module):
            super().__init__()
            self.module = module
    monkeypatch.setitem(MODEL_WRAPPERS._module_dict, 'Wrapper', Wrapper)
    arch = next(a for a in ARCHS if a.id == 'upernet')
    cfg = arch_config(tmp_path, arch._replace(changes='pretrained=None'), 'XCiT')
    model = build_unchecked(cfg)
    with pytest.raises(ChannelMismatchError) as wrapped:
        CheckConsumersHook().before_run(SimpleNamespace(model=Wrapper(SegTTAModel(module=model))))
    with pytest.raises(ChannelMismatchError) as plain:
        check_consumers(model)
    assert str(wrapped.value) == str(plain.value)


def test_a_fitting_model_passes_and_is_checked_once(tmp_path, monkeypatch):
    """Checked once, by ``build_from_config``; its forward passes do not check."""
    calls = []
    monkeypatch.setattr(consumers, 'check_consumers', lambda *a: calls.append(a))
    arch = next(a for a in ARCHS if a.id == 'upernet')
    cfg = arch_config(tmp_path, arch, 'XCiT')
    model = build_model(cfg)
    data = model.eval().data_preprocessor(seg_inputs(1, SIZE, SIZE), False)
    for _ in range(2):
        model(**data, mode='tensor')
    assert calls == [(model,)]
    monkeypatch.undo()
    check_consumers(model)  # nothing raised for the real check either
    CheckConsumersHook().before_run(SimpleNamespace(model=model))


def test_a_backbone_alone_runs_without_a_check(monkeypatch):
    calls = []
    monkeypatch.setattr(consumers, 'check_consumers', lambda *a: calls.append(a))
    model = XCiT('nano_12_p16', out_strides=(16, 32))
    assert len(model(torch.randn(1, 3, 32, 32))) == 2
    check_model(model)  # not a detector or segmentor: left alone
    assert calls == [] and not hasattr(model, 'consumers_checked')


@pytest.mark.slow
def test_message_lists_every_mismatched_head(tmp_path):
    """UperNet with ResNet-50 channels in both heads: the message names both keys to set. Builds the
    stock UperNet (512-channel heads) twice, unchecked and through ``build_from_config``."""
    arch = next(a for a in ARCHS if a.id == 'upernet')
    cfg = arch_config(tmp_path, arch._replace(changes='pretrained=None'), 'XCiT')
    message = mismatch_message(cfg, build_unchecked(cfg))
    keys = re.findall(r'Set (model\.[\w.]+)=', message)
    assert keys == ['model.decode_head.in_channels', 'model.auxiliary_head.in_channels']


def test_a_config_takes_the_channels_from_python(tmp_path):
    """The form docs/architectures.md gives: ``import deepvit_mm`` in the config's text, the neck's
    channels from ``feature_levels`` (the module is left out of the config, its value stays)."""
    cfg = config_from_text(tmp_path, """
_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
import deepvit_mm
custom_imports = dict(imports=['deepvit_mm'])
model = dict(
    backbone=dict(_delete_=True, type='XCiT', arch='nano_12_p16', out_strides=(8, 16, 32)),
    neck=dict(in_channels=deepvit_mm.XCiT.feature_levels('nano_12_p16', (8, 16, 32)).channels,
              start_level=0))
""")
    assert 'deepvit_mm' not in cfg and cfg.model.neck.in_channels == [128, 128, 128]
    model = build_model(cfg)  # checked: the neck fits
    assert model.backbone.out_indices == XCiT.default_out_indices('nano_12_p16', (8, 16, 32))
    cfg.dump(str(tmp_path / 'dumped.py'))  # and the config still dumps
