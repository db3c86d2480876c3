"""Trust: every path that loads weights goes through one matcher with one report, no code runs
from any part of a checkpoint, and importing deepvit_mm changes nothing else in the process."""
import argparse
import logging
import os

import pytest
import timm
import torch
from conftest import ROOT, build_model
from mmengine.config import Config
from mmengine.runner import load_checkpoint

from deepvit_mm import CheckpointError, XCiT, load_weights, read_checkpoint
from deepvit_mm.checkpoints import find_resumable_checkpoint, resolve_checkpoint, trusted_checkpoints
from deepvit_mm.checkpoints.stored_config import config_text_problem
from deepvit_mm.checkpoints.trust import TRUST_ENV

DET_CFG = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
SEG_CFG = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
EVIL = "import os\nos.system('touch PWNED')\nmodel = dict()\n"


def _cfg(path, **backbone):
    cfg = Config.fromfile(path)
    cfg.model.backbone.pop('out_indices', None)  # the arch's own taps: all its blocks
    cfg.model.backbone.update({'arch': 'nano_12_p16', **backbone})
    return cfg


@pytest.fixture(scope='module')
def det(tmp_path_factory):
    """A demo detector (XCiT-N12/16), its config file and its checkpoint written as mmengine
    writes it (config text in meta and message hub)."""
    folder = tmp_path_factory.mktemp('det')
    cfg = _cfg(DET_CFG)
    cfg_file = str(folder / 'det.py')
    cfg.dump(cfg_file)
    torch.manual_seed(3)
    model = build_model(cfg)
    ckpt = str(folder / 'det.pth')
    torch.save({'state_dict': model.state_dict(),
                'meta': {'cfg': cfg.pretty_text, 'dataset_meta': {'classes': ('a', 'b', 'c')}},
                'message_hub': {'runtime_info': {'cfg': cfg.pretty_text}}}, ckpt)
    return cfg_file, ckpt, model.state_dict()


# ------------------------------------------------------------------ every loading path
def _via_init_detector(cfg_file, ckpt):
    from mmdet.apis import init_detector
    return init_detector(cfg_file, ckpt, device='cpu')


def _via_det_inferencer(cfg_file, ckpt):
    from mmdet.apis import DetInferencer
    return DetInferencer(model=cfg_file, weights=ckpt, device='cpu', show_progress=False).model


def _via_runner_load_from(cfg_file, ckpt):
    model = build_model(Config.fromfile(cfg_file))
    load_checkpoint(model, ckpt, map_location='cpu')  # Runner.load_checkpoint's own call chain
    return model


def _via_init_cfg(cfg_file, ckpt):
    cfg = Config.fromfile(cfg_file)
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=ckpt)
    return build_model(cfg, pretrained=True)  # init_weights() loads it


DET_PATHS = [_via_init_detector, _via_det_inferencer, _via_runner_load_from]


@pytest.mark.parametrize('load', DET_PATHS)
@pytest.mark.slow
def test_every_path_loads_through_the_matcher_with_one_report(det, load, logged):
    """``init_detector``, ``DetInferencer`` and mmengine's ``load_checkpoint`` load the demo
    detector's checkpoint through the matcher, with one report. Each builds the detector
    (XCiT-N12/16); the first case also builds it for the module's checkpoint."""
    cfg_file, ckpt, want = det
    model = load(cfg_file, ckpt)
    got = model.state_dict()
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0, msg=k)
    reports = [m for m in logged if m.startswith('weights from')]
    assert len(reports) == 1, logged
    assert f'loaded {len(want)} tensors' in reports[0]
    assert not any('do not match exactly' in m for m in logged)


@pytest.mark.parametrize('load', DET_PATHS + [_via_init_cfg])
@pytest.mark.slow
def test_other_arch_refused_on_every_path(det, tmp_path, load):
    """An XCiT-T12 detector checkpoint is refused by every loading path (``init_cfg``'s too), naming
    the arch it fits. Builds the T12 detector to save, then the N12 one on the path."""
    cfg_file, _, _ = det
    cfg = _cfg(DET_CFG, arch='tiny_12_p16')
    cfg.model.neck.in_channels = [XCiT.arch_zoo['tiny_12_p16'].embed_dim] * 4
    other = build_model(cfg)
    ckpt = str(tmp_path / 'tiny.pth')
    torch.save({'state_dict': other.state_dict()}, ckpt)
    with pytest.raises(CheckpointError, match=r"does not fit XCiT\(nano_12_p16\). It looks like a "
                                              r"checkpoint of XCiT\(arch='tiny_12_p16'\)\. Use a "
                                              r"checkpoint of the same architecture"):
        load(cfg_file, ckpt)


@pytest.mark.parametrize('load', DET_PATHS)
@pytest.mark.slow
def test_timm_classifier_loads_into_the_backbone(det, tmp_path, load, logged):
    """timm's XCiT-N12/16 classifier weights load into the detector's trunk on every path, with one
    report of what was dropped and left at init. timm's model built and saved, the detector
    built."""
    cfg_file, _, _ = det
    torch.manual_seed(5)
    timm_model = timm.create_model('xcit_nano_12_p16_224', num_classes=1000)
    ckpt = str(tmp_path / 'xcit_nano_12_p16_224.pth')
    torch.save(timm_model.state_dict(), ckpt)
    model = load(cfg_file, ckpt)
    want = timm_model.state_dict()
    for k, v in model.backbone.trunk.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0, msg=k)
    # one report: the trunk loaded, the classifier's own parts dropped, the rest left at init
    reports = [m for m in logged if m.startswith('weights from')]
    assert len(reports) == 1, logged
    n_trunk = len(model.backbone.trunk.state_dict())
    assert f'loaded {n_trunk} tensors' in reports[0]
    assert 'dropped on purpose' in reports[0] and 'backbone.trunk.cls_token' in reports[0]
    assert 'left at init' in reports[0] and 'neck.' in reports[0]


@pytest.mark.slow
def test_other_class_count_is_skipped_and_reported(det, tmp_path, logged):
    """A 3-class checkpoint into a 7-class detector: the class tensors are skipped and reported (at
    WARNING through mmengine), refused with ``strict=True``. The detector built twice, three
    loads."""
    cfg_file, ckpt, want = det
    cfg = Config.fromfile(cfg_file)
    cfg.model.roi_head.bbox_head.num_classes = 7
    cfg.model.roi_head.mask_head.num_classes = 7
    model = build_model(cfg)
    report = load_weights(model, read_checkpoint(ckpt), source=ckpt)
    skipped = dict(report.skipped)
    # the demo's box regression is class-agnostic: fc_reg fits any class count and loads
    assert set(skipped) == {'roi_head.bbox_head.fc_cls.weight', 'roi_head.bbox_head.fc_cls.bias',
                            'roi_head.mask_head.conv_logits.weight',
                            'roi_head.mask_head.conv_logits.bias'}
    assert skipped['roi_head.bbox_head.fc_cls.weight'] == 'checkpoint (4, 256) vs model (8, 256)'
    assert 'roi_head.bbox_head.fc_reg.weight' in report.loaded
    assert set(report.left_at_init) == set(skipped)
    assert 'skipped (4)' in report.format()
    # through mmengine's own call chain (load_from, tools/test.py): loaded, said at WARNING
    logged.clear()
    model = build_model(cfg)
    load_checkpoint(model, ckpt, map_location='cpu')
    torch.testing.assert_close(model.state_dict()['roi_head.bbox_head.fc_reg.weight'],
                               want['roi_head.bbox_head.fc_reg.weight'], rtol=0, atol=0)
    reports = [m for m in logged if m.startswith('weights from')]
    assert len(reports) == 1 and 'skipped (4)' in reports[0], logged
    assert reports[0].endswith(f'(level {logging.WARNING})')
    with pytest.raises(CheckpointError, match='strict=True'):
        load_weights(model, read_checkpoint(ckpt), source=ckpt, strict=True)


def test_nothing_loads_refused(det, tmp_path):
    cfg_file, _, _ = det
    ckpt = str(tmp_path / 'resnet.pth')
    torch.save({'state_dict': {'conv1.weight': torch.zeros(64, 3, 7, 7),
                               'fc.weight': torch.zeros(10, 512)}}, ckpt)
    with pytest.raises(CheckpointError, match='nothing of MaskRCNN would load'):
        _via_runner_load_from(cfg_file, ckpt)


@pytest.mark.slow
def test_non_finite_weights_refused_by_name(det, tmp_path):
    """A NaN in one tensor is refused on every loading path, naming the tensor. Each of the three
    paths builds the detector (XCiT-N12/16) and reads the checkpoint."""
    cfg_file, ckpt, want = det
    sd = dict(want)
    sd['neck.fpn_convs.0.conv.weight'] = sd['neck.fpn_convs.0.conv.weight'].clone()
    sd['neck.fpn_convs.0.conv.weight'][0, 0, 0, 0] = float('nan')
    bad = str(tmp_path / 'nan.pth')
    torch.save({'state_dict': sd}, bad)
    for load in DET_PATHS:
        with pytest.raises(CheckpointError, match=r'1 tensors hold NaN or infinite values: '
                                                  r'neck.fpn_convs.0.conv.weight'):
            load(cfg_file, bad)


@pytest.mark.slow
def test_segmentor_paths(tmp_path):
    """A segmentor checkpoint loaded by mmseg's ``init_model`` and ``MMSegInferencer``: every
    tensor where it was saved. ~1-4 s: the segmentor built three times."""
    from mmseg.apis import MMSegInferencer, init_model
    cfg = _cfg(SEG_CFG)
    cfg_file = str(tmp_path / 'seg.py')
    cfg.dump(cfg_file)
    torch.manual_seed(4)
    src = build_model(cfg)
    ckpt = str(tmp_path / 'seg.pth')
    torch.save({'state_dict': src.state_dict(), 'meta': {}}, ckpt)
    for model in (init_model(cfg_file, ckpt, device='cpu'),
                  MMSegInferencer(model=cfg_file, weights=ckpt, device='cpu').model):
        for k, v in src.state_dict().items():
            torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=0, msg=k)
    other = build_model(_cfg(SEG_CFG, arch='nano_12_p8'))
    torch.save({'state_dict': other.state_dict(), 'meta': {}}, ckpt)
    with pytest.raises(CheckpointError, match=r'does not fit XCiT\(nano_12_p16\)'):
        init_model(cfg_file, ckpt, device='cpu')
    with pytest.raises(CheckpointError, match=r'does not fit XCiT\(nano_12_p16\)'):
        MMSegInferencer(model=cfg_file, weights=ckpt, device='cpu')


# ------------------------------------------------------------------ no code from checkpoints
@pytest.mark.slow
def test_config_text_rules():
    """What mmengine stores (``pretty_text``) passes; code, ``_base_``, new ``custom_imports`` and
    calls are refused. Reads the demo detector's config through its mmdet bases and formats it with
    yapf."""
    cfg = Config.fromfile(DET_CFG)
    assert config_text_problem(cfg.pretty_text) is None  # what mmengine itself stores
    for text in (EVIL, 'model = dict(type=__import__("os").system("x"))\n',
                 "_base_ = ['/etc/x.py']\n", 'dict = print\n',
                 "custom_imports = dict(imports=['antigravity'])\n", 'x = [f(1)]\n'):
        assert config_text_problem(text) is not None, text


@pytest.mark.parametrize('place', ['meta.cfg', 'message_hub.cfg'])
@pytest.mark.parametrize('inferencer', ['det', 'seg'])
def test_inferencer_without_config_never_evaluates_code(det, tmp_path, monkeypatch, place,
                                                        inferencer):
    monkeypatch.chdir(tmp_path)
    _, _, sd = det
    ckpt = {'state_dict': sd}
    if place == 'meta.cfg':
        ckpt['meta'] = {'cfg': EVIL}
    else:
        ckpt['message_hub'] = {'runtime_info': {'cfg': EVIL}}
    path = str(tmp_path / 'planted.pth')
    torch.save(ckpt, path)
    if inferencer == 'det':
        from mmdet.apis import DetInferencer as Inferencer
    else:
        from mmseg.apis import MMSegInferencer as Inferencer
    own_api = 'DetInferencer' if inferencer == 'det' else 'MMSegInferencer'
    with pytest.raises(RuntimeError, match=r'did not evaluate the config text stored in checkpoint'
                                           rf'.*{own_api}\(model=CONFIG, weights=CKPT\).*{TRUST_ENV}'):
        Inferencer(model=None, weights=path, device='cpu')
    assert not (tmp_path / 'PWNED').exists()
    # asked for explicitly, it is evaluated as mmengine would
    with trusted_checkpoints(path):
        stored = read_checkpoint(path)
    text = stored['meta']['cfg'] if place == 'meta.cfg' else \
        stored['message_hub']['runtime_info']['cfg']
    assert text == EVIL


@pytest.mark.slow
def test_inferencer_without_config_uses_plain_data_config(det):
    """``DetInferencer(model=None)`` builds the detector from the plain-data config its checkpoint
    stores and loads every tensor. The inferencer builds the detector, its pipeline and
    visualizer."""
    from mmdet.apis import DetInferencer
    _, ckpt, want = det
    model = DetInferencer(model=None, weights=ckpt, device='cpu', show_progress=False).model
    assert model.backbone.arch == 'nano_12_p16'
    for k, v in want.items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=0, msg=k)


def test_resume_config_text_is_not_evaluated(tmp_path):
    """``Runner.resume`` evaluates ``meta['config']``: a planted one stops with our message."""
    path = str(tmp_path / 'iter_4.pth')
    torch.save({'state_dict': {}, 'meta': {'config': EVIL, 'epoch': 0, 'iter': 4}}, path)
    text = read_checkpoint(path)['meta']['config']
    with pytest.raises(RuntimeError, match="checkpoint\\['meta'\\]\\['config'\\].*--resume "
                                           "whatever config you give.*use load_from=CKPT"):
        Config.fromstring(text, '.py')  # exactly what Runner.resume does with it
    assert not (tmp_path / 'PWNED').exists()


def test_pickled_objects_refused_and_trust_opt_in(tmp_path, monkeypatch):
    path = str(tmp_path / 'objects.pth')
    torch.save({'state_dict': {'w': torch.ones(1)}, 'extra': {1, 2}, 'ns': argparse.Namespace(a=1),
                'meta': {'when': __import__('datetime').date(2021, 6, 1)}}, path)
    with pytest.raises(CheckpointError, match=rf'refusing to load.*datetime.date.*{TRUST_ENV}='):
        read_checkpoint(path)
    monkeypatch.setenv(TRUST_ENV, os.pathsep.join(['/elsewhere.pth', path]))
    assert read_checkpoint(path)['meta']['when'].year == 2021


# ------------------------------------------------------------------ paths and URLs
def test_folder_home_and_missing_paths(tmp_path, monkeypatch):
    torch.save({'w': torch.ones(1)}, tmp_path / 'iter_4.pth')
    with pytest.raises(FileNotFoundError, match=r"is a folder, not a checkpoint file.*iter_4.pth"):
        read_checkpoint(str(tmp_path))
    monkeypatch.setenv('HOME', str(tmp_path))
    assert read_checkpoint('~/iter_4.pth')['w'].item() == 1
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        read_checkpoint('~/nope.pth')


@pytest.mark.slow
def test_url_checkpoints_download_once_then_load(det, tmp_path, server, hub_dir, monkeypatch):
    """A URL checkpoint is downloaded once into torch hub's folder (its SHA-256 beside it), then
    loaded by ``load_from`` and ``init_cfg``; a missing one is refused. The detector built twice."""
    www, url, hits = server
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'hub'))
    cfg_file, ckpt, want = det
    (www / 'det.pth').write_bytes(open(ckpt, 'rb').read())
    model = _via_runner_load_from(cfg_file, f'{url}/det.pth')  # load_from, tools/test.py
    for k, v in want.items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=0, msg=k)
    model = _via_init_cfg(cfg_file, f'{url}/det.pth')  # the backbone's init_cfg
    local = resolve_checkpoint(f'{url}/det.pth')
    assert local == str(tmp_path / 'hub' / 'checkpoints' / 'det.pth')
    assert hits == ['/det.pth']  # downloaded once
    assert sorted(n for n in os.listdir(tmp_path / 'hub' / 'checkpoints')
                  if not n.endswith('.lock')) == ['det.pth', 'det.pth.sha256']  # no temporary
    with pytest.raises(CheckpointError, match='cannot download'):
        resolve_checkpoint(f'{url}/missing.pth')


# ------------------------------------------------------------------ DINO
def _dino_checkpoint(teacher, student):
    def wrap(m, prefix):
        sd = {f'{prefix}backbone.{k}': v for k, v in m.state_dict().items()}
        sd[f'{prefix}head.mlp.0.weight'] = torch.zeros(8, 128)
        sd[f'{prefix}head.last_layer.weight_g'] = torch.ones(65536, 1)
        return sd
    return {'teacher': wrap(teacher, ''), 'student': wrap(student, 'module.'),
            'optimizer': {'state': {}, 'param_groups': []}, 'epoch': 300,
            'args': argparse.Namespace(arch='xcit_nano_12_p16', lr=0.0005, out_dim=65536),
            'dino_loss': {'center': torch.zeros(1, 65536)}}


@pytest.mark.slow
def test_dino_training_checkpoint_teacher_by_default_student_on_request(tmp_path):
    """A DINO training checkpoint gives the teacher by default, the student on request. ~1-4 s."""
    from mmdet.registry import MODELS
    torch.manual_seed(1)
    teacher = timm.create_model('xcit_nano_12_p16_224', num_classes=0)
    student = timm.create_model('xcit_nano_12_p16_224', num_classes=0)
    path = str(tmp_path / 'checkpoint.pth')
    torch.save(_dino_checkpoint(teacher, student), path)
    for key, src in ((None, teacher), ('student', student)):
        init = dict(type='Pretrained', checkpoint=path)
        if key:
            init['checkpoint_key'] = key
        m = MODELS.build(dict(type='XCiT', arch='nano_12_p16', init_cfg=init))
        m.init_weights()
        report = m.load_pretrained(path, checkpoint_key=key)
        for k, v in src.state_dict().items():
            if not k.startswith(('cls_attn_blocks', 'norm.', 'cls_token')):
                torch.testing.assert_close(m.trunk.state_dict()[k], v, rtol=0, atol=0, msg=k)
        assert 'head.mlp.0.weight' in report.dropped
    with pytest.raises(CheckpointError, match="checkpoint_key='ema'"):
        MODELS.build(dict(type='XCiT', arch='nano_12_p16')).load_pretrained(path, 'ema')
    # its Namespace is admitted, not what a Namespace holds
    ckpt = _dino_checkpoint(teacher, student)
    ckpt['args'].since = __import__('datetime').date(2021, 6, 1)
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match=r'not plain data \(datetime.date\)'):
        MODELS.build(dict(type='XCiT', arch='nano_12_p16')).load_pretrained(path)


@pytest.mark.slow
def test_dino_release_loads(tmp_path):
    """The official DINO XCiT releases are the backbone's state dict alone (no head)."""
    torch.manual_seed(2)
    src = timm.create_model('xcit_nano_12_p16_224', num_classes=0)
    path = str(tmp_path / 'dino_xcit_nano_12_p16_pretrain.pth')
    torch.save(src.state_dict(), path)
    from deepvit_mm import XCiT
    m = XCiT('nano_12_p16')
    report = m.load_pretrained(path)
    assert not report.skipped and all(k.startswith('adapter.') for k in report.left_at_init)


# ------------------------------------------------------------------ no side effects
def test_import_changes_no_other_file_io(tmp_path):
    import mmengine
    from mmengine.fileio import get_file_backend
    from mmengine.fileio.backends import LocalBackend
    assert type(get_file_backend(str(tmp_path / 'x.json'))) is LocalBackend
    real = tmp_path / 'real.json'
    real.write_text('{}')
    link = tmp_path / 'link.json'
    link.symlink_to(real)
    mmengine.dump({'a': 1}, str(link))
    assert link.is_symlink() and real.read_text() == '{"a": 1}'
    private = tmp_path / 'private.json'
    private.write_text('{}')
    private.chmod(0o600)
    mmengine.dump({'a': 2}, str(private))
    assert (private.stat().st_mode & 0o777) == 0o600


def test_other_models_load_as_mmengine_loads_them(tmp_path, logged):
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 4))
    path = str(tmp_path / 'other.pth')
    torch.save({'state_dict': {'0.weight': torch.ones(3, 2), 'extra': torch.ones(1)}}, path)
    load_checkpoint(model, path)
    text = '\n'.join(logged)
    assert 'The model and loaded state dict do not match exactly' in text  # mmengine's message
    assert 'unexpected key in source state_dict: extra' in text
    assert 'weights from' not in text
    torch.testing.assert_close(model[0].weight, torch.ones(3, 2))


# ------------------------------------------------------------------ resume
def test_resume_recognises_legacy_format_and_warns_when_none(tmp_path, logged):
    assert find_resumable_checkpoint(str(tmp_path)) is None
    assert logged == [f'--resume: no complete checkpoint in {str(tmp_path)!r}; training starts '
                      'from iteration 0. (level 30)']
    torch.save({'state_dict': {'w': torch.ones(2)}, 'meta': {'iter': 4}}, tmp_path / 'iter_4.pth',
               _use_new_zipfile_serialization=False)
    assert find_resumable_checkpoint(str(tmp_path)) == str(tmp_path / 'iter_4.pth')


def test_trust_is_scoped_to_its_block_and_thread(tmp_path):
    """``trusted_checkpoints`` trusts its files inside its ``with`` block, in the thread that
    entered it: nested blocks add to the outer one's files, leaving a block restores them, and
    another thread (a data loader, a server handling another request) is not affected."""
    import threading

    from deepvit_mm.checkpoints.trust import is_trusted
    a, b = str(tmp_path / 'a.pth'), str(tmp_path / 'b.pth')
    seen = []
    with trusted_checkpoints(a):
        with trusted_checkpoints(b):
            assert is_trusted(a) and is_trusted(b)
            thread = threading.Thread(target=lambda: seen.append(is_trusted(a) or is_trusted(b)))
            thread.start()
            thread.join()
        assert is_trusted(a) and not is_trusted(b)
    assert not is_trusted(a) and seen == [False]
