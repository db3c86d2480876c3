"""What ``import deepvit_mm`` changes outside its own objects is what its docstring and
docs/install.md list, and ``DEEPVIT_MM_KEEP_MMENGINE_LOADER=1`` leaves mmengine's checkpoint
loading as it was."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow  # fresh interpreters importing mmdet and mmseg

# mmengine's state that the import may change: the checkpoint reader's schemes, load_state_dict,
# the config package table, the config's get_installed_path and is_installed, the hub's
# get_installed_path and install_package
_PROBE = r"""
import json, os, sys
import mmengine.config.config as mm_config
import mmengine.hub.hub as mm_hub
from mmengine.config.utils import MODULE2PACKAGE
from mmengine.runner import checkpoint as mm_ckpt


def state():
    schemes = {k: f'{v.__module__}.{v.__qualname__}'
               for k, v in mm_ckpt.CheckpointLoader._schemes.items()}
    return dict(schemes=schemes,
                load_state_dict=mm_ckpt.load_state_dict.__module__,
                get_installed_path=mm_config.get_installed_path.__module__,
                is_installed=mm_config.is_installed.__module__,
                hub_get_installed_path=mm_hub.get_installed_path.__module__,
                hub_install_package=mm_hub.install_package.__module__,
                packages=sorted(MODULE2PACKAGE))


before = state()
import deepvit_mm
after = state()
# what the import read of the architecture tables: nothing (the names when a table is first
# looked into, an arch's timm model when it is asked for)
from deepvit_mm import ColumnarBackbone
from deepvit_mm.models.backbones.arch_table import read_timm_arch
tables = [f.__name__ for f in ColumnarBackbone.families if '_names' in vars(f.arch_zoo)]
print(json.dumps(dict(before=before, after=after, families=len(ColumnarBackbone.families),
                      tables_read=tables, timm_models_read=read_timm_arch.cache_info().currsize)))
"""


def _probe(keep: bool) -> dict:
    env = dict(os.environ, PYTHONWARNINGS='ignore')
    env.pop('DEEPVIT_MM_KEEP_MMENGINE_LOADER', None)
    if keep:
        env['DEEPVIT_MM_KEEP_MMENGINE_LOADER'] = '1'
    run = subprocess.run([sys.executable, '-c', _PROBE], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('keep', [False, True], ids=['default', 'keep_mmengine_loader'])
def test_import_changes_only_what_it_lists(keep):
    """``import deepvit_mm`` in a fresh process changes only what docs list, and reads no
    architecture table. ~5-10 s: the process."""
    got = _probe(keep)
    before, after = got['before'], got['after']
    # no architecture table read
    assert got['families'] >= 5 and got['tables_read'] == [] and got['timm_models_read'] == 0, got
    # the config package: always, and for the name deepvit_mm only
    assert after['packages'] == sorted(before['packages'] + ['deepvit_mm'])
    for name in ('get_installed_path', 'is_installed', 'hub_get_installed_path',
                 'hub_install_package'):
        assert after[name] == 'deepvit_mm.config_package', name
    if keep:  # mmengine's checkpoint loading exactly as it was
        assert (after['schemes'], after['load_state_dict']) == \
            (before['schemes'], before['load_state_dict'])
    else:  # the reader of local paths and URLs, and load_state_dict: deepvit_mm's
        changed = {k for k in after['schemes'] if after['schemes'][k] != before['schemes'].get(k)}
        assert changed == {'', 'http://', 'https://'}, changed
        assert after['load_state_dict'] == 'deepvit_mm.checkpoints.mmengine_hooks'


def test_the_side_effects_are_listed_in_the_docs_and_the_docstring():
    """deepvit_mm's docstring and docs/install.md name the opt-out variable and each thing the
    import changes. Reads text in this process only: slow by the module's marker (its other tests
    start interpreters)."""
    import deepvit_mm
    with open(os.path.join(ROOT, 'docs', 'install.md')) as f:
        docs = f.read()
    for text in (deepvit_mm.__doc__, docs):
        assert 'DEEPVIT_MM_KEEP_MMENGINE_LOADER=1' in text
        for what in ('MODELS', 'get_installed_path', 'is_installed', 'load_state_dict',
                     'CPUAmpOptimWrapper'):
            assert what in text, what
