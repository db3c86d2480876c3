"""The model zoo (model-index.yml, metafiles/), its FLOPs counts, mim, and the image demo.

* every recipe has a metafile entry, every entry's config exists, and its #params and FLOPs are
  what ``tools/analysis/get_flops.py`` counts;
* the count (torch's FlopCounterMode on the meta device) agrees, module by module, with an
  independent one: fvcore's jit-trace counter on timm's own model; attention is counted as the
  papers' formulas say;
* a wheel built from this tree works with mim (``mim search``, ``mim train``, ``mim test``; mim
  needs ``pkg_resources``, which the package's ``setuptools<82`` keeps), and with mmengine's ``get_config``
  (the metafile's weights) with or without ``pkg_resources``;
* ``demo/image_demo.py`` draws a detector's and a segmentor's predictions, with weights from a
  local file and from an URL.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
import yaml
from conftest import ROOT, run_in_process

RECIPES = sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py')))
DEMO_SEG = os.path.join(ROOT, 'configs', 'demo', 'sem_fpn_xcit_nano_12_p16_ade_demo.py')
DEMO_DET = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
ENV = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
# openmim 0.3.9 imports pkg_resources at start-up, which setuptools 82 removed: the package
# requires setuptools<82 (setup.py), so every environment it installs into starts mim
# (tests/test_deps.py::test_the_environment_has_pkg_resources)


def _zoo():
    """(metafile path, model entry) of every model that model-index.yml imports."""
    with open(os.path.join(ROOT, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    out = []
    for rel in index['Import']:
        with open(os.path.join(ROOT, rel)) as f:
            meta = yaml.safe_load(f)
        collections = {c['Name'] for c in meta.get('Collections', [])}
        for model in meta['Models']:
            assert model['In Collection'] in collections, (rel, model['Name'])
            out.append((rel, model))
    return out


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


# ------------------------------------------------------------------------------ model index
def test_every_recipe_has_one_metafile_entry_and_every_config_exists():
    zoo = _zoo()
    names = [m['Name'] for _, m in zoo]
    assert len(names) == len(set(names))
    for rel, m in zoo:
        assert os.path.isfile(os.path.join(ROOT, m['Config'])), (rel, m['Config'])
        assert m['Name'] == _stem(m['Config'])
        assert isinstance(m['Metadata']['Parameters'], int)
        assert isinstance(m['Metadata']['FLOPs'], int)
    assert sorted(_stem(m['Config']) for _, m in zoo) == sorted(_stem(c) for c in RECIPES)


# recipes whose metafile Results are another source's, as their config headers quote them
REPORTED = {'mask_rcnn_vit_b_16_vitdet_100e': 'box AP {}, mask AP {}',
            'upernet_beit_b_16_640_160k_ade20k': 'mIoU {}'}


def test_metafile_weights_are_the_official_xcit_release_of_the_recipe():
    """Weights only where facebookresearch/xcit released the model (its detection/ and
    semantic_segmentation/ READMEs), named for the recipe's arch; results only with them."""
    url = {'mask_rcnn': 'coco/maskrcnn', 'sem_fpn': 'ade/sem_fpn', 'upernet': 'ade/upernet'}
    with_weights = 0
    for _, m in _zoo():
        name = m['Name']
        official = name.startswith(tuple(url)) and '_xcit_' in name and not re.search(
            r'_(psne|fsne8s)_', name)
        if name in REPORTED:  # the result the recipe's header quotes for the model it follows
            assert 'Weights' not in m, name
            values = [v for r in m['Results'] for v in r['Metrics'].values()]
            with open(os.path.join(ROOT, m['Config'])) as f:
                header = f.read(2000)
            assert values and REPORTED[name].format(*values) in header, name
            continue
        assert ('Weights' in m) == official == ('Results' in m), name
        if official:
            with open(os.path.join(ROOT, m['Config'])) as f:
                arch = re.search(r"^arch = '(\w+)'$", f.read(), flags=re.M).group(1)
            method = next(k for k in url if name.startswith(k))
            assert m['Weights'] == f'https://dl.fbaipublicfiles.com/xcit/{url[method]}_xcit_{arch}.pth'
            with_weights += 1
    assert with_weights == 24


@pytest.mark.slow
def test_metafile_params_and_flops_are_what_get_flops_counts():
    """Every entry's Parameters and FLOPs (exact) against ``config_flops`` at the tables' sizes
    (meta device, a backbone shared by two recipes counted once: ~1 s a recipe, ~30 s in all)."""
    from deepvit_tools.benchmark.flops import config_flops
    wrong = []
    for _, m in _zoo():
        r = config_flops(os.path.join(ROOT, m['Config']))
        if (r.params, r.flops) != (m['Metadata']['Parameters'], m['Metadata']['FLOPs']):
            wrong.append(f"{m['Name']}: metafile {m['Metadata']['Parameters']} / "
                         f"{m['Metadata']['FLOPs']}, counted {r.params} / {r.flops}")
    assert not wrong, ('update metafiles/ (python tools/analysis/get_flops.py CONFIG --json F):\n'
                       + '\n'.join(wrong))



def test_model_zoo_page_is_written_from_the_metafiles():
    """configs/README.md (the model-zoo page the README points to) is what the metafiles say."""
    from deepvit_tools.model_zoo import PAGE, page
    with open(PAGE) as f:
        assert f.read() == page(), 'configs/README.md is stale: python tools/model_zoo.py'
    for _, m in _zoo():
        assert f"]({os.path.basename(m['Config'])})" in page(), m['Name']


def test_readme_paper_results_are_the_metafiles():
    """The README's table of the paper's results: each cell is its recipe's metafile Results."""
    results = {}
    for _, m in _zoo():
        for r in m.get('Results', []):
            results.setdefault(m['Name'], []).extend(r['Metrics'].values())
    with open(os.path.join(ROOT, 'README.md')) as f:
        rows = [[c.strip() for c in line.strip('|\n').split('|')]
                for line in f if line.startswith('| ')]
    head = next(r for r in rows if r[0] == 'XCiT')
    archs = [a.lower().replace('/', '_') for a in head[1:]]  # 'T12/16' -> 't12_16'
    det = next(r for r in rows if r[0].startswith('Mask R-CNN'))
    seg = next(r for r in rows if r[0].startswith('ADE20k'))
    for arch, d, s in zip(archs, det[1:], seg[1:]):
        assert [float(v) for v in d.split(' / ')] == results[f'mask_rcnn_xcit_{arch}_3x'], arch
        assert [float(v) for v in s.split(' / ')] == (results[f'sem_fpn_xcit_{arch}_80k_ade20k']
                                                      + results[f'upernet_xcit_{arch}_160k_ade20k'])
    assert len(archs) == 8

# ------------------------------------------------------------------------------ FLOPs
_MATMUL_OPS = {'conv', 'linear', 'matmul', 'bmm', 'addmm', 'mm', 'einsum', 'baddbmm'}


@pytest.mark.parametrize('arch,shape', [('nano_12_p16', (160, 224)), ('tiny_12_p8', (96, 128)),
                                        ('xxs24', (224, 224))])
@pytest.mark.slow
def test_flops_match_fvcore_on_timm_block_by_block(arch, shape):
    """Our count of our backbone (FlopCounterMode, meta device, our forward) equals fvcore's
    jit-trace count of timm's model (``forward_features``, real tensors) for the patch
    embedding, the position encoding and every block, attention included; fvcore's norms
    (which FlopCounterMode does not count) are left out."""
    import timm
    from fvcore.nn import FlopCountAnalysis

    from deepvit_tools.benchmark.flops import backbone_macs
    from deepvit_tools.benchmark.models import build_backbone
    backbone = build_backbone(arch)  # CaiT: global attention by default
    ours = backbone_macs(backbone, shape)
    ref_model = timm.create_model(backbone.arch_zoo[backbone.arch].timm, num_classes=0).eval()
    analysis = FlopCountAnalysis(ref_model, torch.randn(1, 3, *shape))
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    ref = {k: sum(n for op, n in ops.items() if op in _MATMUL_OPS)
           for k, ops in analysis.by_module_and_operator().items()}
    names = ['patch_embed', 'pos_embed'] + [f'blocks.{i}' for i in range(len(ref_model.blocks))]
    for name in names:
        assert ours.get(f'trunk.{name}', 0) == ref.get(name, 0), name
    assert sum(ref[f'blocks.{i}.attn'] for i in range(len(ref_model.blocks))) > 0
    # the adapter adds its ConvTranspose layers; nothing else runs
    adapter = sum(v for k, v in ours.items() if k.startswith('adapter.') and k.count('.') == 2)
    assert ours[''] == sum(ours.get(f'trunk.{n}', 0) for n in names) + adapter


@pytest.mark.slow
def test_attention_counts_follow_the_papers_formulas():
    """XCA: q^T k and attn v, d^2 N / h multiply-adds each per block; talking heads in k x k
    windows (and globally in the tapped blocks): q k^T and attn v, n^2 d each, and the two
    head mixings, n^2 h^2 each, per window of n tokens."""
    from deepvit_tools.benchmark.flops import attention_macs, backbone_macs
    from deepvit_tools.benchmark.models import build_backbone
    xcit = build_backbone('nano_12_p16')  # d 128, 4 heads, 12 blocks
    macs = backbone_macs(xcit, (160, 224))
    n = 10 * 14
    assert attention_macs(xcit, macs) == 12 * 2 * 128 ** 2 * n // 4

    cait = build_backbone('xxs24', window_size=7)  # d 192, 4 heads; taps 7, 11, 15, 23 global
    macs = backbone_macs(cait, (224, 448))  # 14 x 28 grid: 2 x 4 windows of 7 x 7
    d, h = 192, 4
    windowed, full = 2 * 4 * 2 * 49 ** 2 * (d + h * h), 2 * (14 * 28) ** 2 * (d + h * h)
    assert len(cait.global_blocks) == 4
    assert attention_macs(cait, macs) == 20 * windowed + 4 * full


@pytest.mark.slow
def test_get_flops_tool_reports_backbone_neck_and_heads(tmp_path):
    """tools/analysis/get_flops.py as a process: its JSON has each part and their sum. ~10-20 s: the
    tool's process and a count on the meta device."""
    out = tmp_path / 'flops.json'
    run = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'analysis', 'get_flops.py'),
                          DEMO_SEG, DEMO_DET, '--shape', '256', '320', '--json', str(out)],
                         capture_output=True, text=True, timeout=600, env=ENV, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'backbone GFLOPs' in run.stdout and 'sem_fpn_xcit_nano_12_p16_ade_demo' in run.stdout
    seg, det = json.loads(out.read_text())
    assert seg['shape'] == det['shape'] == [256, 320]
    assert list(seg['parts']) == ['backbone', 'neck', 'decode_head']
    assert list(det['parts']) == ['backbone', 'neck', 'rpn_head', 'roi_head']
    assert det['parts']['roi_head']['note'] == '300 RoIs, masks on 100'  # the demo's test_cfg
    for r in (seg, det):
        assert all(p['flops'] > 0 and p['params'] > 0 for p in r['parts'].values())
        assert r['gflops'] == pytest.approx(
            sum(p['flops'] for p in r['parts'].values()) / 1e9, abs=0.051)


# ------------------------------------------------------------------------------ mim
@pytest.fixture(scope='module')
def installed(tmp_path_factory):
    """This tree built into a wheel (setup.py as ``pip install .`` runs it) and unpacked into a
    folder that goes first on PYTHONPATH: an installed deepvit_mm, as mim finds packages."""
    tmp = tmp_path_factory.mktemp('wheel')
    src = tmp / 'src'
    files = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard'], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        if rel.startswith('deepvit_mm/.mim') or not os.path.isfile(os.path.join(ROOT, rel)):
            continue
        os.makedirs(src / os.path.dirname(rel), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), src / rel)
    build = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-index',
                            '--no-build-isolation', '-q', '-w', str(tmp / 'dist'), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = glob.glob(str(tmp / 'dist' / '*.whl'))
    site = tmp / 'site'
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def _listed(stdout: str) -> list:
    """The config ids ``mim search`` printed."""
    return re.findall(r'^config id: (\S+)$', stdout, flags=re.M)


def _mim(site, *args, cwd, timeout=600):
    env = dict(ENV, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, '-m', 'mim', *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(cwd))


@pytest.mark.slow
def test_wheel_ships_the_model_index_tools_and_configs(installed):
    """The built wheel's .mim holds model-index.yml, its metafiles, the configs and the tools. The
    first test of the module's wheel (``installed``: ~10 s, ``pip wheel`` of this tree)."""
    mim = installed / 'deepvit_mm' / '.mim'
    with open(mim / 'model-index.yml') as f:
        index = yaml.safe_load(f)
    for rel in index['Import']:
        with open(mim / rel) as f:
            for m in yaml.safe_load(f)['Models']:
                assert (mim / m['Config']).is_file(), m['Config']  # as mim and mmengine read it
    assert (mim / 'tools' / 'train.py').is_file() and (mim / 'tools' / 'test.py').is_file()
    assert (mim / 'configs' / 'configs' / '_base_' / 'default_runtime.py').is_file()
    # every config and tool, nested folders included (named one by one in setup.py: setuptools
    # before 62.3 drops what only a '**' glob names)
    for top, into in (('configs', 'configs/configs'), ('tools', 'tools')):
        want = {os.path.relpath(p, os.path.join(ROOT, top))
                for p in glob.glob(os.path.join(ROOT, top, '**', '*.*'), recursive=True)
                if p.endswith(('.py', '.sh')) and '__pycache__' not in p}
        got = {os.path.relpath(p, mim / into)
               for p in glob.glob(str(mim / into / '**' / '*.*'), recursive=True)}
        assert want and want <= got, sorted(want - got)


@pytest.mark.slow
def test_wheel_requires_what_import_accepts(installed):
    """pip refuses what ``import deepvit_mm`` refuses: the wheel's Requires-Dist ranges are
    version.SUPPORTED's, its Requires-Python version.PYTHON; mmdet and mmsegmentation come only
    with their extras (``det``, ``seg``, ``all``), as import needs one of them, not both; the
    extras pin nothing that downgrades setuptools further than below 82."""
    from deepvit_mm.version import PYTHON, SUPPORTED, TOOLBOXES
    (meta,) = glob.glob(str(installed / '*.dist-info' / 'METADATA'))
    requires = re.findall(r'^Requires-Dist: (.+)$', open(meta).read(), flags=re.M)
    for pkg in ('mmengine', 'mmdet', 'mmsegmentation', 'timm'):
        lo, hi = SUPPORTED[pkg]
        lines = [r for r in requires if re.match(rf'{pkg}\b', r)]
        for line in lines:
            assert set(re.findall(r'[<>=!]+[\w.]+', line.split(';')[0])) == {f'>={lo}', f'<{hi}'}, line
        markers = sorted(line.partition(';')[2].strip() for line in lines)
        if pkg in TOOLBOXES:
            assert markers == sorted(f'extra == "{e}"' for e in ('all', TOOLBOXES[pkg]['extra'])), lines
        else:
            assert markers == [''], lines
    assert [r for r in requires if r.startswith('opendatalab')] and all(
        '<0.0.10' in r for r in requires if r.startswith('opendatalab')), requires
    # pkg_resources stays (mmengine's 'mmdet::' bases, mim): setuptools below 82, for every install
    assert [r for r in requires if r.startswith('setuptools')] == ['setuptools<82'], requires
    # and the Pythons import accepts
    (python,) = re.findall(r'^Requires-Python: (.+)$', open(meta).read(), flags=re.M)
    assert set(python.split(',')) == {f'>={PYTHON[0]}', f'<{PYTHON[1]}'}, python


def test_mim_without_pkg_resources():
    """Without pkg_resources (setuptools >= 82) mim stops at start-up, as docs/install.md#mim says;
    the recipes do not need it (tests/configs/test_upstream.py)."""
    code = ("import sys, runpy\nsys.modules['pkg_resources'] = None\nsys.argv = ['mim', '--help']\n"
            "runpy.run_module('mim', run_name='__main__')\n")
    run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                         env=ENV)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].startswith('ModuleNotFoundError'), run.stderr[-2000:]
    assert 'pkg_resources' in run.stderr.strip().splitlines()[-1]
    with open(os.path.join(ROOT, 'docs', 'install.md')) as f:
        assert 'mim needs `pkg_resources`' in f.read()


@pytest.mark.slow
def test_mim_search_lists_every_recipe(installed, tmp_path):
    """``mim search deepvit_mm`` (and ``--json``) lists every recipe. ~10-20 s: two mim
    processes."""
    run = _mim(installed, 'search', 'deepvit_mm', cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    listed = _listed(run.stdout)
    assert sorted(listed) == sorted(_stem(c) for c in RECIPES)
    run = _mim(installed, 'search', 'deepvit_mm', '--json', str(tmp_path / 'zoo.json'),
               cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads((tmp_path / 'zoo.json').read_text())
    zoo = {m['Name']: m for _, m in _zoo()}
    assert found['parameters'] == {n: m['Metadata']['Parameters'] for n, m in zoo.items()}
    assert {n: w for n, w in found['weight'].items() if w} == {
        n: m['Weights'] for n, m in zoo.items() if 'Weights' in m}
    run = _mim(installed, 'search', 'deepvit_mm', '--model', 'xcit mask r-cnn', '--condition',
               'parameters>60000000', '--field', 'parameters', 'flops', 'weight', cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _listed(run.stdout) == [
        'mask_rcnn_xcit_s24_16_3x', 'mask_rcnn_xcit_s24_8_3x', 'mask_rcnn_xcit_m24_16_3x',
        'mask_rcnn_xcit_m24_8_3x']


def _installed_editable() -> bool:
    """pip installed this checkout editable (its record in site-packages; the checkout's own
    egg-info, first on sys.path in the tests, says nothing of how)."""
    from importlib.metadata import distributions
    from pathlib import Path
    for d in distributions(name='deepvit_mm'):
        record = json.loads(d.read_text('direct_url.json') or '{}')
        if (record.get('dir_info', {}).get('editable')
                and record.get('url') == Path(ROOT).resolve().as_uri()):
            return True
    return False


@pytest.mark.slow
@pytest.mark.skipif(not _installed_editable(), reason='deepvit_mm is not installed editable here')
def test_mim_finds_an_editable_install_through_the_checkout(tmp_path):
    """docs/install.md: mim looks for a package's files beside its metadata; an editable install
    (``make setup``) has its metadata in site-packages and its files in the checkout, whose
    ``deepvit_mm.egg-info`` mim finds first when the checkout is on ``sys.path``. The ``mim``
    command alone does not find them."""
    mim = [os.path.join(os.path.dirname(sys.executable), 'mim'), 'search', 'deepvit_mm']
    env = {k: v for k, v in ENV.items() if k != 'PYTHONPATH'}
    runs = {'python -m mim, in the checkout': subprocess.run(
                [sys.executable, '-m', 'mim', *mim[1:]], cwd=ROOT, env=env, capture_output=True,
                text=True, timeout=300),
            'PYTHONPATH=<checkout> mim': subprocess.run(
                mim, cwd=tmp_path, env=dict(env, PYTHONPATH=ROOT), capture_output=True,
                text=True, timeout=300)}
    for how, run in runs.items():
        assert run.returncode == 0, (how, run.stderr[-2000:])
        listed = _listed(run.stdout)
        assert sorted(listed) == sorted(_stem(c) for c in RECIPES), how
    alone = subprocess.run(mim, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert alone.returncode != 0 and 'model-index.yml' in alone.stdout + alone.stderr


@pytest.mark.slow
def test_mmengine_get_config_takes_the_metafile_weights(installed, tmp_path):
    """mmengine's ``get_config('deepvit_mm::...')`` from the installed wheel, in a process: the
    metafile's weights. ~10 s: the process."""
    code = ("import deepvit_mm\nfrom mmengine.hub import get_config\n"
            "cfg = get_config('deepvit_mm::configs/upernet_xcit_s12_16_160k_ade20k.py', "
            "pretrained=True)\nprint(cfg.model_path, cfg.model.backbone.arch)\n")
    run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                         env=dict(ENV, PYTHONPATH=str(installed)), cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-2:] == [
        'https://dl.fbaipublicfiles.com/xcit/ade/upernet_xcit_small_12_p16.pth', 'small_12_p16']


@pytest.mark.skipif(not _installed_editable(), reason='deepvit_mm is not installed editable here')
@pytest.mark.slow
def test_mim_train_and_test_run_the_tools(installed, tmp_path):
    """``mim train deepvit_mm CONFIG`` (by name: mim finds it in .mim) runs .mim/tools/train.py
    from the wheel, here 2 iterations of the demo segmentor with a TensorBoard backend; ``mim
    test`` then evaluates its checkpoint from the editable install with the checkout on the path
    (docs/install.md#mim): each install starts a tool. ~40 s: two mim processes."""
    from deepvit_tools.demo_data import make_ade_demo
    data = tmp_path / 'ade'
    make_ade_demo(str(data), num_train=2, num_val=2, size=128, seed=3)
    opts = ['--cfg-options', f'train_dataloader.dataset.data_root={data}',
            f'test_dataloader.dataset.data_root={data}', f'val_dataloader.dataset.data_root={data}',
            'train_cfg.max_iters=2', 'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2',
            'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
            'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
            'val_dataloader.persistent_workers=False', 'param_scheduler=[]']
    work = tmp_path / 'work'
    run = _mim(installed, 'train', 'deepvit_mm', os.path.basename(DEMO_SEG), '--work-dir',
               str(work), '--vis-backend', 'local', 'tensorboard', *opts, cwd=tmp_path)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert re.search(re.escape(str(installed)) + r'/deepvit_mm/\.mim/tools/train\.py', log), \
        log[-3000:]
    assert glob.glob(str(work / '*' / 'vis_data' / 'events.out.tfevents.*')), log[-3000:]
    assert glob.glob(str(work / '*' / 'vis_data' / 'scalars.json'))
    ckpt = work / 'iter_2.pth'
    assert ckpt.is_file()
    run = _mim(ROOT, 'test', 'deepvit_mm', os.path.basename(DEMO_SEG), '--checkpoint',
               str(ckpt), '--work-dir', str(tmp_path / 'test'), *opts[:3], cwd=tmp_path)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert re.search(r'\.mim/tools/test\.py', log) and re.search(r'mIoU: \d+\.\d+', log), log[-3000:]
    assert str(installed) not in log, log[-3000:]


# ------------------------------------------------------------------------------ image demo
def _demo_checkpoint(config: str, path) -> None:
    """A detector/segmentor checkpoint of ``config`` with random weights, no class names."""
    from deepvit_mm.apis import build_from_config
    model, _ = build_from_config(config)
    torch.save({'state_dict': model.state_dict()}, str(path))


@pytest.mark.parametrize('config', [DEMO_SEG, DEMO_DET], ids=['seg', 'det'])
@pytest.mark.slow
def test_image_demo_draws_predictions_from_a_file_and_an_url(config, tmp_path, server, monkeypatch,
                                                             logged, hub_dir):
    """demo/image_demo.py with the weights in a file and at a URL, in this process; the
    detector's from the URL in a process of its own (~10 s, its imports)."""
    from deepvit_tools.demo_data import make_ade_demo, make_shapes_coco
    seg = config == DEMO_SEG
    if seg:
        make_ade_demo(str(tmp_path / 'data'), num_train=1, num_val=1, size=128, seed=1)
        (image,) = glob.glob(str(tmp_path / 'data' / 'images' / 'validation' / '*.jpg'))
    else:
        make_shapes_coco(str(tmp_path / 'data'), num_train=1, num_val=1, size=128, seed=1)
        (image,) = glob.glob(str(tmp_path / 'data' / 'val' / '*.png'))
    www, url, hits = server
    _demo_checkpoint(config, www / 'model.pth')
    env = dict(ENV, TORCH_HOME=str(tmp_path / 'torch_home'))
    monkeypatch.setenv('TORCH_HOME', env['TORCH_HOME'])
    demo = os.path.join(ROOT, 'demo', 'image_demo.py')
    for weights, out in ((str(www / 'model.pth'), 'out_file'), (f'{url}/model.pth', 'out_url')):
        args = [image, config, '--weights', weights, '--out-dir', str(tmp_path / out),
                '--score-thr', '0']
        if out == 'out_file' or seg:
            monkeypatch.chdir(tmp_path)
            start = len(logged)
            assert run_in_process(monkeypatch, demo, *args) == 0
            log = '\n'.join(logged[start:]) + '\n'
        else:
            run = subprocess.run([sys.executable, demo, *args], capture_output=True, text=True,
                                 timeout=600, env=env, cwd=str(tmp_path))
            log = run.stdout + run.stderr
            assert run.returncode == 0, log[-3000:]
        assert re.search(r"weights from .*model.pth' into \w+: loaded \d+ tensors\n", log), log[-3000:]
        name = os.path.basename(image)
        assert (tmp_path / out / 'vis' / name).is_file(), log[-3000:]
        if seg:
            assert glob.glob(str(tmp_path / out / 'pred' / '*.png'))
        else:
            pred = json.loads((tmp_path / out / 'preds' / (os.path.splitext(name)[0] + '.json'))
                              .read_text())
            assert len(pred['bboxes']) == len(pred['scores']) > 0
    assert hits == ['/model.pth']  # downloaded once


def test_image_demo_names_the_missing_weights(tmp_path, in_process):
    """demo/image_demo.py (in this process) names a weights file that is not there."""
    run = in_process(os.path.join(ROOT, 'demo', 'image_demo.py'), 'x.jpg', DEMO_SEG, '--weights',
                     str(tmp_path / 'nothing.pth'), cwd=tmp_path)
    assert run.returncode != 0 and 'nothing.pth' in run.stderr
