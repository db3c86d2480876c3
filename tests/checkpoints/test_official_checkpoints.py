"""The detection/segmentation checkpoints released with the XCiT paper load as they are.

They were trained with the official code (facebookresearch/xcit: mmdet 2.11 / mmseg 0.11). Its
backbone keys are ``backbone.patch_embed.proj.0.0.*``, ``backbone.blocks.N.*``,
``backbone.pos_embeder.*`` and ``backbone.fpn{1..4}.*``; its necks and heads carry mmdet/mmseg
names, which mmdet 3.x / mmseg 1.x kept for these models (FPN ``lateral_convs``/``fpn_convs``;
RPN ``rpn_conv``/``rpn_cls``/``rpn_reg``; ``roi_head.bbox_head.shared_fcs``/``fc_cls``/``fc_reg``;
``roi_head.mask_head.convs``/``upsample``/``conv_logits``; UPerHead ``psp_modules``/
``bottleneck``/``lateral_convs``/``fpn_convs``/``fpn_bottleneck``; FCNHead ``convs``; FPNHead
``scale_heads``; ``conv_seg``). The tests write checkpoints in that layout themselves (the whole
detector/segmentor state dict, with the meta data the old tools saved) and check that mmengine's
loading (``load_from``, ``tools/test.py``) takes every tensor and that the backbone then computes
what the official code computed.
"""
import os
import re
import textwrap

import pytest
import torch
import torch.nn as nn
from conftest import ROOT
from mmengine.config import Config
from mmengine.model.utils import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint

from deepvit_mm import XCiT


def to_official_layout(state_dict: dict) -> dict:
    """Our detector/segmentor keys -> the official XCiT code's (backbone keys only change)."""
    out = {}
    for k, v in state_dict.items():
        if k.startswith('backbone.trunk.'):
            k = 'backbone.' + k[len('backbone.trunk.'):].replace('pos_embed.', 'pos_embeder.')
        elif k.startswith('backbone.adapter.levels.'):
            i, rest = k[len('backbone.adapter.levels.'):].split('.', 1)
            k = f'backbone.fpn{int(i) + 1}.{rest}'
        out[k] = v.clone()
    return out


def _randomize(model: nn.Module) -> None:
    """Non-default values everywhere (BN statistics, LayerScale...), so loading is visible."""
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.dtype.is_floating_point:
                continue
            if 'running_var' in name:
                t.uniform_(0.5, 1.5)
            else:
                t.normal_(0, 0.05 if t.dim() > 1 else 0.5)


def _old_meta(**extra) -> dict:
    """What mmcv 1.x's save_checkpoint wrote next to the weights (plain data only)."""
    return dict(mmcv_version='1.3.0', time='Mon Jun 14 10:00:00 2021', env_info='...',
                config='model = dict(...)', seed=0, exp_name='xcit.py',
                hook_msgs=dict(last_ckpt='/checkpoint/iter_160000.pth'), iter=160000, **extra)


def _official_forward(backbone: XCiT, official: dict, x: torch.Tensor):
    """The official backbone's forward_features (facebookresearch/xcit, detection/ and
    semantic_segmentation/backbone/xcit.py), spelled out: no input padding; the trunk (timm's
    XCiT blocks compute what the official XCABlock/XCA/LPI/ConvPatchEmbed do, and its position
    encoding is the same Fourier encoding); taps are raw block outputs at blocks out_indices; then
    the official fpn1..fpn4 modules built as the official code builds them, loaded from the
    checkpoint's backbone.fpn* tensors."""
    import timm
    spec = XCiT.arch_zoo[backbone.arch]
    trunk = timm.create_model(spec.timm, num_classes=0).eval()
    trunk_sd = {k[len('backbone.'):].replace('pos_embeder.', 'pos_embed.'): v
                for k, v in official.items()
                if k.startswith('backbone.') and not k.startswith('backbone.fpn')}
    missing, unexpected = trunk.load_state_dict(trunk_sd, strict=False)
    assert not unexpected and all(k.startswith(('cls_attn', 'cls_token', 'norm.'))
                                  for k in missing)
    d = spec.embed_dim
    if spec.patch_size == 16:
        fpn = [nn.Sequential(nn.ConvTranspose2d(d, d, 2, 2), nn.BatchNorm2d(d), nn.GELU(),
                             nn.ConvTranspose2d(d, d, 2, 2)),
               nn.Sequential(nn.ConvTranspose2d(d, d, 2, 2)), nn.Identity(), nn.MaxPool2d(2, 2)]
    else:
        fpn = [nn.Sequential(nn.ConvTranspose2d(d, d, 2, 2)), nn.Identity(),
               nn.Sequential(nn.MaxPool2d(2, 2)), nn.Sequential(nn.MaxPool2d(4, 4))]
    for i, op in enumerate(fpn):
        prefix = f'backbone.fpn{i + 1}.'
        sd = {k[len(prefix):]: v for k, v in official.items() if k.startswith(prefix)}
        op.load_state_dict(sd)
        op.eval()
    with torch.no_grad():
        taps = trunk.forward_intermediates(x, indices=list(backbone.out_indices),
                                           intermediates_only=True)
        return [op(t) for op, t in zip(fpn, taps)]


def _mmseg_model(tmp_path, text):
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmseg')
    path = tmp_path / 'cfg.py'
    path.write_text(textwrap.dedent(text))
    cfg = Config.fromfile(str(path))
    return revert_sync_batchnorm(MODELS.build(cfg.model)).eval()


UPERNET = """
    _base_ = '{root}/configs/upernet_xcit_t12_16_160k_ade20k.py'
    model = dict(
        backbone=dict(arch='{arch}', init_cfg=None),
        decode_head=dict(in_channels=[128] * 4, channels=32),
        auxiliary_head=dict(in_channels=128, channels=16))
    """


@pytest.mark.parametrize('arch', ['nano_12_p16', 'nano_12_p8'])
@pytest.mark.slow
def test_official_segmentor_checkpoint_loads_and_computes_the_same(tmp_path, arch):
    """A UperNet checkpoint in the official layout loads every tensor through mmengine and the
    backbone computes what the official one did. Two UperNets (XCiT-N12, 32-channel heads) and
    timm's XCiT built, forwards of each at 83x130."""
    src = _mmseg_model(tmp_path, UPERNET.format(root=ROOT, arch=arch))
    _randomize(src)
    official = to_official_layout(src.state_dict())
    # the layout the issue describes, per patch size
    if arch.endswith('p16'):
        assert {'backbone.fpn1.0.weight', 'backbone.fpn1.1.running_mean', 'backbone.fpn1.3.weight',
                'backbone.fpn2.0.weight'} <= set(official)
    else:
        assert 'backbone.fpn1.0.weight' in official and 'backbone.fpn2.0.weight' not in official
    assert not any(k.startswith(('backbone.fpn3', 'backbone.fpn4')) for k in official)
    assert {'backbone.patch_embed.proj.0.0.weight', 'backbone.pos_embeder.token_projection.weight',
            'backbone.blocks.0.local_mp.conv1.weight', 'backbone.blocks.0.gamma3',
            'decode_head.psp_modules.0.1.conv.weight', 'decode_head.fpn_bottleneck.conv.weight',
            'auxiliary_head.convs.0.conv.weight', 'decode_head.conv_seg.weight'} <= set(official)
    path = tmp_path / 'upernet_xcit_official.pth'
    torch.save(dict(state_dict=official, optimizer=dict(state={}, param_groups=[]),
                    meta=_old_meta(mmseg_version='0.11.0', CLASSES=('wall', 'building'),
                                   PALETTE=[[120, 120, 120], [180, 120, 120]])), path)

    torch.manual_seed(123)
    dst = _mmseg_model(tmp_path, UPERNET.format(root=ROOT, arch=arch))
    load_checkpoint(dst, str(path), map_location='cpu', strict=True)  # every key, no leftovers
    want = src.state_dict()
    for k, v in dst.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0, msg=k)

    # the backbone computes what the official one did, on a size that is no multiple of 32
    x = torch.randn(1, 3, 83, 130)
    got = dst.backbone(x)
    ref = _official_forward(dst.backbone, official, x)
    assert [g.shape for g in got] == [r.shape for r in ref]
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(dst(x, mode='tensor'), src(x, mode='tensor'))


@pytest.mark.slow
def test_official_detector_checkpoint_loads_and_computes_the_same(tmp_path):
    """A Mask R-CNN checkpoint in the official layout loads every tensor through mmengine and the
    backbone computes what the official one did. Two Mask R-CNNs (XCiT-N12/8, 32-channel neck and
    heads) and timm's XCiT built, backbone forwards at 96x160."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmdet')
    path = tmp_path / 'cfg.py'
    path.write_text(textwrap.dedent(f"""
        _base_ = '{ROOT}/configs/mask_rcnn_xcit_t12_8_3x.py'
        model = dict(backbone=dict(arch='nano_12_p8', init_cfg=None),
                     neck=dict(in_channels=[128] * 4, out_channels=32),
                     rpn_head=dict(in_channels=32, feat_channels=32),
                     roi_head=dict(bbox_roi_extractor=dict(out_channels=32),
                                   bbox_head=dict(in_channels=32, fc_out_channels=64),
                                   mask_roi_extractor=dict(out_channels=32),
                                   mask_head=dict(in_channels=32, conv_out_channels=32)))
        """))
    cfg = Config.fromfile(str(path))
    src = revert_sync_batchnorm(MODELS.build(cfg.model)).eval()
    _randomize(src)
    official = to_official_layout(src.state_dict())
    assert {'backbone.fpn1.0.weight', 'neck.lateral_convs.0.conv.weight', 'rpn_head.rpn_conv.weight',
            'roi_head.bbox_head.shared_fcs.0.weight', 'roi_head.bbox_head.fc_cls.weight',
            'roi_head.mask_head.conv_logits.weight'} <= set(official)
    ckpt = tmp_path / 'maskrcnn_xcit_official.pth'
    torch.save(dict(state_dict=official, meta=_old_meta(mmdet_version='2.11.0',
                                                        CLASSES=('person', 'bicycle'))), ckpt)
    torch.manual_seed(7)
    dst = revert_sync_batchnorm(MODELS.build(cfg.model)).eval()
    load_checkpoint(dst, str(ckpt), map_location='cpu', strict=True)
    want = src.state_dict()
    for k, v in dst.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0, msg=k)
    # mmdet pads its batches to 32, where padding or not makes no difference
    x = torch.randn(1, 3, 96, 160)
    got = dst.backbone(x)
    for g, r in zip(got, _official_forward(dst.backbone, official, x)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_our_own_layout_is_left_alone_by_the_hook():
    """A state dict in our own layout loads through torch's ``load_state_dict`` exactly as saved.
    Two XCiT-N12/16 built."""
    m = XCiT('nano_12_p16')
    _randomize(m)
    sd = {f'backbone.{k}': v for k, v in m.state_dict().items()}
    wrapper = nn.Module()
    wrapper.backbone = XCiT('nano_12_p16')
    wrapper.load_state_dict(sd, strict=True)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(wrapper.backbone.state_dict()[k], v, rtol=0, atol=0)


@pytest.mark.parametrize('arch', ['nano_12_p16', 'nano_12_p8'])
@pytest.mark.slow
def test_unpadded_input_sizes_and_minimum(arch):
    """Unpadded, the levels' sizes follow the conv stem's rounding up, and an input under the
    minimum is refused naming it. XCiT-N12 built, forwards at 83x130 and at the minimum size."""
    m = XCiT(arch, pad_input=False).eval()
    p = m.patch_size
    with torch.no_grad():
        outs = m(torch.randn(1, 3, 83, 130))
    tokens = [-(-83 // p), -(-130 // p)]  # the conv stem rounds up
    up = {8: [2, 1, 1 / 2, 1 / 4], 16: [4, 2, 1, 1 / 2]}[p]
    assert [tuple(o.shape[-2:]) for o in outs] == [tuple(int(t * f) for t in tokens) for f in up]
    least = 32 - p + 1
    m(torch.randn(1, 3, least, least))
    with pytest.raises(ValueError, match=f'at least {least} pixels'):
        m(torch.randn(1, 3, least - 1, 64))


@pytest.mark.slow
def test_tools_test_on_generated_ade20k_returns_miou(tmp_path, server, monkeypatch, in_process):
    """`tools/test.py CONFIG URL` on the generated ADE20k-format data, with a checkpoint in the
    official layout (mmseg 0.x meta data) served over HTTP: it is downloaded, loads completely and
    mIoU comes out; a backbone-only checkpoint is refused (it would evaluate to nothing). (The
    tool runs in this process: tests/test_one_toolbox.py starts it as a process.)"""
    from deepvit_tools.demo_data import make_ade_demo
    data = tmp_path / 'ade'
    make_ade_demo(str(data), num_train=1, num_val=3, size=128, seed=3)
    demo = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
    src = _mmseg_model(tmp_path, f"_base_ = '{demo}'")
    _randomize(src)
    www, url, _ = server
    official = to_official_layout(src.state_dict())
    torch.save(dict(state_dict=official, meta=_old_meta(mmseg_version='0.11.0')),
               www / 'sem_fpn_official.pth')
    torch.save({k[len('backbone.'):]: v for k, v in official.items() if k.startswith('backbone.')},
               www / 'backbone_only.pth')
    opts = [f'{k}={v}' for k, v in {
        'test_dataloader.dataset.data_root': data, 'test_dataloader.num_workers': 0,
        'test_dataloader.persistent_workers': False}.items()]
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))

    def test(name):
        out = in_process(os.path.join(ROOT, 'tools', 'test.py'), demo, f'{url}/{name}',
                         '--work-dir', str(tmp_path / 'work'), '--cfg-options', *opts,
                         cwd=str(tmp_path))
        return out.returncode, out.stdout + out.stderr
    code, log = test('sem_fpn_official.pth')
    assert code == 0, log[-3000:]
    n = len(src.state_dict())
    assert re.search(rf"weights from .*sem_fpn_official.pth' into EncoderDecoder: loaded {n} "
                     r'tensors\n', log), log[-3000:]
    assert 'left at init' not in log and 'skipped' not in log, log[-3000:]
    assert re.findall(r'mIoU: (\d+\.\d+)', log), log[-3000:]
    code, log = test('backbone_only.pth')
    assert code != 0
    assert re.search(r'has no weights for \d+ tensors of EncoderDecoder: neck.*looks like a '
                     r'backbone checkpoint', log), log[-3000:]
