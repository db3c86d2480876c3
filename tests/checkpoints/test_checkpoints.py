"""Weights: every supported checkpoint format/layout loads, reports, and bad ones are refused."""
import io
import os

import numpy as np
import pytest
import timm
import torch
from conftest import EARLY, ROOT, official_xcit_state_dict
from mmdet.registry import MODELS
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import _load_checkpoint
from safetensors.torch import save_file

from deepvit_mm import CheckpointError, ColumnarBackbone, XCiT, read_checkpoint
from deepvit_mm.models.backbones.families import arch_from_state_dict
from deepvit_mm.utils import meta_device

ARCH = 'nano_12_p16'


@pytest.fixture(scope='module')
def timm_model():
    torch.manual_seed(1)
    m = timm.create_model('xcit_nano_12_p16_224', num_classes=1000).eval()
    for mod in m.modules():  # non-default BN statistics, so loading them is visible
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.3, 0.3)
    return m


def _build(path, arch=ARCH):
    m = MODELS.build(dict(type='XCiT', arch=arch,
                          init_cfg=dict(type='Pretrained', checkpoint=str(path))))
    m.init_weights()
    return m.eval()


def _assert_taps_match(backbone, timm_model):
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        want = timm_model.forward_intermediates(x, indices=list(backbone.out_indices),
                                                intermediates_only=True)
        got = backbone._forward_taps(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_official_release_pth(tmp_path, timm_model):
    """The official release layout loads with ``load_pretrained``: taps equal timm's, the report
    says what was dropped and left at init. Builds timm's XCiT-N12/16 (the module's fixture) and
    ours, saves and loads the file, runs both at 64x96."""
    path = tmp_path / 'xcit_nano_12_p16_224.pth'
    torch.save(official_xcit_state_dict(timm_model), path)
    m = XCiT(ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    report = m.load_pretrained(str(path))
    _assert_taps_match(m.eval(), timm_model)
    dropped = set(report.dropped)
    assert {'trunk.head.weight', 'trunk.cls_token', 'trunk.norm.weight'} <= dropped
    assert any(k.startswith('trunk.cls_attn_blocks.') for k in dropped)
    assert all(k.startswith('adapter.') for k in report.left_at_init)
    assert len(report.left_at_init) > 0
    text = report.format()
    assert 'dropped on purpose' in text and 'left at init' in text and 'adapter.levels' in text


@pytest.mark.slow
def test_init_cfg_pretrained_goes_through_our_loader(tmp_path, timm_model):
    """``init_cfg=Pretrained`` of a backbone built through mmdet's registry loads an official file:
    taps equal timm's. A checkpoint saved, XCiT-N12/16 built and loaded, both models run at
    64x96."""
    path = tmp_path / 'official.pth'
    torch.save(official_xcit_state_dict(timm_model), path)
    m = _build(path)
    _assert_taps_match(m, timm_model)


@pytest.mark.slow
def test_timm_pth_and_safetensors(tmp_path, timm_model):
    """timm's state dict as .pth, .safetensors and suffix-less safetensors: each loads, taps equal
    timm's. Three files saved; XCiT-N12/16 built, loaded and run at 64x96 for each."""
    sd = {k: v.contiguous() for k, v in timm_model.state_dict().items()}
    torch.save(sd, tmp_path / 'timm.pth')
    save_file(sd, str(tmp_path / 'timm.safetensors'))
    save_file(sd, str(tmp_path / 'no_suffix.bin'))  # detected by content, not the suffix
    for name in ('timm.pth', 'timm.safetensors', 'no_suffix.bin'):
        _assert_taps_match(_build(tmp_path / name), timm_model)


def _mmengine_meta():
    hub = MessageHub.get_instance('test_ckpt_meta')
    hub.update_scalar('train/loss', 0.5)
    hub.update_scalar('train/loss', np.float64(0.25))
    hub.update_info('iter', np.int64(7))
    return dict(epoch=1, iter=7, message_hub=hub.state_dict(),
                dataset_meta=dict(classes=('a', 'b'), palette=[(1, 2, 3)]))


@pytest.mark.slow
def test_detector_checkpoint_with_mmengine_meta_loads_everything(tmp_path):
    """A detector checkpoint with mmengine's meta data loads every backbone tensor, and mmengine's
    own reader reads its message hub. Two XCiT-N12/16 built, the checkpoint saved and read twice."""
    src = XCiT(ARCH)
    for p in src.adapter.parameters():
        p.data.normal_()
    sd = {f'backbone.{k}': v for k, v in src.state_dict().items()}
    sd['neck.lateral_convs.0.conv.weight'] = torch.zeros(1)
    path = tmp_path / 'detector.pth'
    torch.save(dict(state_dict=sd, meta=_mmengine_meta(), optimizer={}), path)
    m = _build(path)
    for k, v in src.state_dict().items():
        torch.testing.assert_close(m.state_dict()[k], v)
    # mmengine's own loading path (load_from / resume / tools/test.py) reads it too
    ckpt = _load_checkpoint(str(path), map_location='cpu')
    buf = ckpt['meta']['message_hub']['log_scalars']['train/loss']
    assert isinstance(buf, HistoryBuffer) and buf.mean() == pytest.approx(0.375)


@pytest.mark.slow
def test_official_detection_layout_maps_fpn_levels(tmp_path):
    """The official detection layout (``backbone.fpn1..4``, ``pos_embeder``) loads into the trunk
    and the adapter's levels. Two XCiT-N12/16 built, a checkpoint saved and loaded."""
    src = XCiT('nano_12_p16')
    for p in src.adapter.parameters():
        p.data.normal_()
    sd = {}
    for k, v in src.state_dict().items():
        k = k.replace('trunk.pos_embed.', 'trunk.pos_embeder.')
        if k.startswith('adapter.levels.'):
            i, rest = k[len('adapter.levels.'):].split('.', 1)
            k = f'fpn{int(i) + 1}.{rest}'
        else:
            k = k[len('trunk.'):]
        sd['backbone.' + k] = v
    assert 'backbone.fpn1.3.weight' in sd and 'backbone.fpn2.0.weight' in sd  # patch 16 layout
    path = tmp_path / 'official_det.pth'
    torch.save({'state_dict': sd, 'meta': {}}, path)
    m = _build(path)
    for k, v in src.state_dict().items():
        torch.testing.assert_close(m.state_dict()[k], v)


@pytest.mark.slow
def test_other_size_refused_with_tensor_names(tmp_path):
    """An XCiT-T12 checkpoint into N12 is refused naming the mismatched tensors and the arch it
    fits. timm's XCiT-T12/16 built and saved, ours built."""
    big = timm.create_model('xcit_tiny_12_p16_224')
    path = tmp_path / 'tiny.pth'
    torch.save(official_xcit_state_dict(big), path)
    with pytest.raises(CheckpointError) as e:
        _build(path, arch='nano_12_p16')
    msg = str(e.value)
    assert 'another shape' in msg and 'trunk.patch_embed.proj.0.0.weight' in msg
    assert 'missing from it' not in msg  # a mismatched tensor is reported once
    assert "XCiT(arch='tiny_12_p16')" in msg  # says what it looks like


@pytest.mark.slow
def test_deeper_model_refused(tmp_path):
    """An XCiT-T24 checkpoint into T12 is refused naming the blocks T12 lacks. timm's XCiT-T24/16
    built and saved, ours (T12/16) built."""
    deep = timm.create_model('xcit_tiny_24_p16_224')
    path = tmp_path / 'tiny24.pth'
    torch.save(deep.state_dict(), path)
    with pytest.raises(CheckpointError, match=r"tiny_24_p16.*does not have.*trunk\.blocks\.\*"):
        _build(path, arch='tiny_12_p16')


@pytest.mark.parametrize('family', ColumnarBackbone.families, ids=lambda f: f.__name__)
def test_arch_from_state_dict_is_a_name_or_none(family):
    """Each family names the arch of its own state dict and None for the others'; a state dict
    of the family that no arch has (a block fewer) gives None, and the refusal's description says
    what it found (structures built on the meta device)."""
    arch = family.arch_zoo.examples[0]
    with meta_device():
        sd = family(arch).state_dict()
    for fam in ColumnarBackbone.families:
        assert arch_from_state_dict(fam, sd) == (arch if fam is family else None), fam.__name__
    depth = family.arch_zoo[arch].depth
    fewer = {k: v for k, v in sd.items() if not k.startswith(f'trunk.blocks.{depth - 1}.')}
    assert arch_from_state_dict(family, fewer) is None
    traits = family.state_dict_traits(fewer)
    assert traits['depth'] == depth - 1 and traits['embed_dim'] == family.arch_zoo[arch].embed_dim
    with meta_device():
        other = next(f for f in ColumnarBackbone.families if f is not family)
        desc = other(other.arch_zoo.examples[0]).describe_state_dict(fewer)
    assert desc.startswith(f'It looks like a checkpoint of {family.__name__} (embed_dim=') and \
        f'depth={depth - 1}' in desc and 'of none of the archs deepvit_mm names' in desc, desc


@pytest.mark.slow
def test_other_family_refused(tmp_path):
    """A ViT checkpoint is refused naming TimmViT's arch, a ConvNeXt one as a model deepvit_mm does
    not know. timm's ViT-Ti/16 and test ConvNeXt built and saved, XCiT-N12/16 built for each."""
    # another family deepvit_mm builds: named, with the arch to set
    vit = timm.create_model('vit_tiny_patch16_224')
    path = tmp_path / 'vit.pth'
    torch.save(vit.state_dict(), path)
    with pytest.raises(CheckpointError, match=r"It looks like a checkpoint of TimmViT\(arch="
                                              r"'vit_tiny_patch16_224'\).*missing from it"):
        _build(path)
    # a model it does not build
    convnext = timm.create_model('test_convnext')
    torch.save(convnext.state_dict(), path)
    with pytest.raises(CheckpointError, match='not a checkpoint of a model deepvit_mm knows.*'
                                              'missing from it'):
        _build(path)


class _Payload:
    def __reduce__(self):
        return (os.system, ('touch PWNED_BY_CHECKPOINT',))


def test_pickle_payload_refused_everywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {'x': torch.zeros(1)}, 'meta': _Payload()}, path)
    with pytest.raises(CheckpointError, match='refusing to load.*posix.system|refusing to load'):
        read_checkpoint(str(path))
    with pytest.raises(CheckpointError, match='refusing'):
        _build(path)
    with pytest.raises(CheckpointError, match='refusing'):
        _load_checkpoint(str(path), map_location='cpu')  # load_from, --resume, tools/test.py
    assert not (tmp_path / 'PWNED_BY_CHECKPOINT').exists()


def test_getattr_standin_only_allows_history_buffer_methods(tmp_path):
    class _Evil:
        def __init__(self, obj, name):
            self.obj, self.name = obj, name

        def __reduce__(self):
            return (getattr, (self.obj, self.name))
    for obj, name in [(torch.Tensor, 'add_'), (HistoryBuffer, '__init__')]:
        buf = io.BytesIO()
        torch.save({'meta': {'f': _Evil(obj, name)}}, buf)
        path = tmp_path / 'getattr.pth'
        path.write_bytes(buf.getvalue())
        with pytest.raises(CheckpointError, match='refusing'):
            read_checkpoint(str(path))


def test_missing_empty_truncated(tmp_path, timm_model):
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        read_checkpoint(str(tmp_path / 'nope.pth'))
    (tmp_path / 'empty.pth').write_bytes(b'')
    with pytest.raises(CheckpointError, match='empty'):
        read_checkpoint(str(tmp_path / 'empty.pth'))
    buf = io.BytesIO()
    torch.save(timm_model.state_dict(), buf)
    (tmp_path / 'cut.pth').write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        read_checkpoint(str(tmp_path / 'cut.pth'))
    save_file({'a': torch.zeros(10)}, str(tmp_path / 'x.safetensors'))
    data = (tmp_path / 'x.safetensors').read_bytes()
    (tmp_path / 'cut.safetensors').write_bytes(data[:-8])
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        read_checkpoint(str(tmp_path / 'cut.safetensors'))
    buf = io.BytesIO()  # the legacy (non-zip) format, cut short
    torch.save(timm_model.state_dict(), buf, _use_new_zipfile_serialization=False)
    (tmp_path / 'cut_legacy.pth').write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        read_checkpoint(str(tmp_path / 'cut_legacy.pth'))
    (tmp_path / 'text.pth').write_text('not a checkpoint at all')
    with pytest.raises(CheckpointError):
        read_checkpoint(str(tmp_path / 'text.pth'))


@pytest.mark.slow
def test_mmengine_checkpoint_reads_in_a_fresh_process(tmp_path):
    """``--resume`` reads in a new process, where no HistoryBuffer was built yet (mmengine fills
    its table of statistics methods lazily): the pickled ``getattr(HistoryBuffer, 'min')`` must
    still be honoured there."""
    import subprocess
    import sys
    buf = HistoryBuffer()
    buf.update(0.5)
    path = tmp_path / 'run.pth'
    torch.save({'state_dict': {'w': torch.ones(2)},
                'message_hub': {'log_scalars': {'loss': buf}}}, path)
    code = ('import sys; sys.path.insert(0, sys.argv[2]); '
            'from deepvit_mm.checkpoints import read_checkpoint; '
            "b = read_checkpoint(sys.argv[1])['message_hub']['log_scalars']['loss']; "
            'print(b.min(), b.mean())')
    out = subprocess.run([sys.executable, '-c', code, str(path), ROOT], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ['0.5', '0.5']


@pytest.mark.parametrize('layout', ['mmengine', 'official', 'safetensors'])
@pytest.mark.slow
def test_mmengine_loads_name_the_file_in_the_report(tmp_path, monkeypatch, layout):
    """mmengine's load_checkpoint (load_from, --resume, tools/test.py, the inferencers) reads
    through the safe reader and loads through the matcher, whose report names the file read:
    the name travels with the state dict, whatever container the file has."""
    from mmengine.runner import load_checkpoint

    import deepvit_mm.checkpoints.mmengine_hooks as hooks
    seen = []
    real = hooks.load_weights
    monkeypatch.setattr(hooks, 'load_weights',
                        lambda *a, **kw: seen.append(kw['source']) or real(*a, **kw))
    src = XCiT('nano_12_p16')
    sd = src.state_dict()
    path = tmp_path / ('weights.safetensors' if layout == 'safetensors' else 'weights.pth')
    if layout == 'safetensors':
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        torch.save(dict(state_dict=sd, meta={}) if layout == 'mmengine' else dict(model=sd), path)
    dst = XCiT('nano_12_p16')
    load_checkpoint(dst, str(path), map_location='cpu')
    assert seen == [repr(str(path))]
    for k, v in sd.items():
        assert torch.equal(dst.state_dict()[k], v), k


@pytest.mark.slow
def test_a_complete_model_is_required_by_argument_or_block():
    """A backbone-only checkpoint leaves the rest of a model at init: refused with
    ``require_complete=True`` (deploy's export) or inside ``require_complete_model()`` (mmengine's
    loads in tools/test.py, which take no such argument); loaded otherwise."""
    from deepvit_mm.checkpoints import load_weights, require_complete_model
    model = torch.nn.Module()
    model.backbone, model.neck = XCiT('nano_12_p16'), torch.nn.Linear(2, 2)
    backbone_only = XCiT('nano_12_p16').state_dict()
    with pytest.raises(CheckpointError, match=r'has no weights for 2 tensors of Module: neck.*'
                                              'looks like a backbone checkpoint'):
        load_weights(model, backbone_only, require_complete=True, log=False)
    with require_complete_model():
        with pytest.raises(CheckpointError, match='has no weights for 2 tensors'):
            load_weights(model, backbone_only, log=False)
        load_weights(model, backbone_only, require_complete=False, log=False)  # the argument wins
    report = load_weights(model, backbone_only, log=False)
    assert report.left_at_init == ['neck.weight', 'neck.bias']


def test_a_plan_copies_nothing_and_loading_applies_it():
    """``plan_load`` computes which tensor goes where and the report, copying nothing;
    ``load_weights`` applies that plan in one step and returns its report."""
    from deepvit_mm.checkpoints import load_weights, plan_load
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.backbone, model.neck = XCiT(ARCH, out_indices=EARLY), torch.nn.Linear(2, 2)
    source = torch.nn.Module()
    source.backbone, source.neck = XCiT(ARCH, out_indices=EARLY), torch.nn.Linear(3, 3)
    ckpt = {'state_dict': {**source.state_dict(), 'head.fc.weight': torch.zeros(4)}}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = plan_load(model, ckpt, source='ckpt')
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert sorted(plan.tensors) == plan.report.loaded
    assert plan.report.loaded == sorted(k for k in before if k.startswith('backbone.'))
    assert sorted(k for k, _ in plan.report.skipped) == ['head.fc.weight', 'neck.bias',
                                                          'neck.weight']
    assert plan.report.left_at_init == ['neck.weight', 'neck.bias']
    report = load_weights(model, ckpt, source='ckpt', log=False)
    assert report == plan.report
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in plan.tensors.items())
    assert torch.equal(after['neck.weight'], before['neck.weight'])
