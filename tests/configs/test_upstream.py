"""The recipes inherit mmdet's and mmseg's configs from byte-identical copies of the installed
files (``configs/_base_/upstream/``), so that they load without ``pkg_resources``: mmengine 0.10
resolves ``'mmdet::...'`` through it, and setuptools 82 removed it."""
import glob
import os
import sys

import pytest
from conftest import CONFIG_DIR, stock_config
from mmengine.config import Config

from deepvit_mm.apis import read_config
from deepvit_mm.apis.config import PKG_RESOURCES_GONE

UPSTREAM = os.path.join(CONFIG_DIR, '_base_', 'upstream')
COPIES = sorted(os.path.relpath(p, UPSTREAM)
                for p in glob.glob(os.path.join(UPSTREAM, '*', '**', '*.py'), recursive=True))
RECIPES = sorted(os.path.relpath(p, CONFIG_DIR)
                 for p in glob.glob(os.path.join(CONFIG_DIR, '**', '*.py'), recursive=True))


@pytest.fixture
def no_pkg_resources(monkeypatch):
    """``import pkg_resources`` fails, as with setuptools >= 82."""
    monkeypatch.setitem(sys.modules, 'pkg_resources', None)


def test_the_copies_are_the_installed_files():
    assert len(COPIES) == 11, COPIES
    for copy in COPIES:
        package, path = copy.split(os.sep, 1)
        with open(os.path.join(UPSTREAM, copy), 'rb') as mine, open(stock_config(f'{package}::{path}'),
                                                                    'rb') as theirs:
            assert mine.read() == theirs.read(), (
                f'{copy} differs from the installed {package}\'s: copy that file again')


def test_no_config_names_a_package_config():
    """A ``'mmdet::'`` base would need ``pkg_resources``; every base the recipes take from mmdet
    and mmseg is under configs/_base_/upstream/."""
    for rel in RECIPES:
        if rel.startswith(os.path.join('_base_', 'upstream')):
            continue
        with open(os.path.join(CONFIG_DIR, rel)) as f:
            text = f.read()
        assert "mmdet::" not in text and "mmseg::" not in text, rel


@pytest.mark.parametrize('rel', [r for r in RECIPES if not r.startswith('_base_')])
def test_every_config_loads_without_pkg_resources(rel, no_pkg_resources):
    cfg = read_config(os.path.join(CONFIG_DIR, rel))
    assert cfg.default_scope in ('mmdet', 'mmseg') and cfg.model.type, rel


def test_stock_config_is_the_file_mmengine_finds():
    """Where ``pkg_resources`` is there, mmengine's ``mmdet::`` is the file ``stock_config`` (the
    tests' users' configs) names."""
    pytest.importorskip('pkg_resources')
    for name in ('mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', 'mmseg::_base_/default_runtime.py'):
        path, scope = Config._get_cfg_path(name, CONFIG_DIR)
        assert os.path.samefile(path, stock_config(name)) and scope == name.split('::')[0]


def test_a_package_base_without_pkg_resources_names_the_setuptools(tmp_path, no_pkg_resources):
    """A user's ``_base_ = 'mmdet::...'`` cannot be read by mmengine 0.10 without
    ``pkg_resources``: the tools' reader says which setuptools to install, in one line."""
    cfg = tmp_path / 'mine.py'
    cfg.write_text("_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'\n")
    with pytest.raises(ModuleNotFoundError, match='pkg_resources'):
        Config.fromfile(str(cfg))  # mmengine's own, as mmdet's tools meet it
    with pytest.raises(ImportError) as e:
        read_config(str(cfg))
    assert str(e.value) == f'{cfg}: {PKG_RESOURCES_GONE}' and 'setuptools<82' in str(e.value)
    assert e.value.__suppress_context__


def _docs_package_examples() -> list:
    """(page, library, config text) of every config example in docs/ whose base is an installed
    library's (``_base_ = 'mmdet::...'`` or ``'mmseg::...'``), as OpenMMLab teaches them."""
    import re

    from conftest import ROOT
    found = []
    for page in sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md'))):
        with open(page) as f:
            for block in re.findall(r'^```python\n(.*?)^```', f.read(), flags=re.M | re.S):
                m = re.match(r"_base_ = '(mmdet|mmseg)::", block)
                if m:
                    found.append((os.path.basename(page), m.group(1), block))
    return found


DOCS_EXAMPLES = _docs_package_examples()


def test_the_docs_have_package_base_examples():
    assert {lib for _, lib, _ in DOCS_EXAMPLES} == {'mmdet', 'mmseg'}, DOCS_EXAMPLES


@pytest.mark.slow
@pytest.mark.parametrize('page,library,text', DOCS_EXAMPLES,
                         ids=[f'{p}-{i}' for i, (p, _, _) in enumerate(DOCS_EXAMPLES)])
def test_docs_examples_load_through_the_libraries_own_tools(tmp_path, page, library, text):
    """The docs' ``mmdet::``/``mmseg::`` examples load through mmdet's and mmseg's own
    ``tools/misc/print_config.py`` (their ``Config.fromfile``, as their ``tools/train.py`` reads a
    config; run from the installed package's ``.mim``), a process started as a user would, and
    through this project's tools' reader; each names our backbone. Each starts a process that
    imports mmdet or mmseg (~10 s of CPU)."""
    import subprocess
    cfg = tmp_path / 'mine.py'
    cfg.write_text(text)
    tool = os.path.join(os.path.dirname(stock_config(f'{library}::x')), '..', 'tools', 'misc',
                        'print_config.py')
    # in tmp_path: mmseg's print_config.py writes example.py where it runs
    run = subprocess.run([sys.executable, os.path.normpath(tool), str(cfg)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONWARNINGS='ignore'))
    assert run.returncode == 0, run.stderr[-3000:]
    backbone = read_config(str(cfg)).model.backbone.type
    assert backbone in ('XCiT', 'CaiT') and f"type='{backbone}'" in run.stdout, run.stdout[-3000:]
