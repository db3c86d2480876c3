"""deepvit_mm with only mmdet or only mmsegmentation installed: it registers what that library's
models use, builds, trains and tests its demo through the tools, and says what to install for a
config of the other; with neither, ``import deepvit_mm`` says what to install.

Each environment is this one in a fresh interpreter whose site-packages is a folder of links to
this one's entries, less the library left out (its package and its distribution metadata):
imports, ``importlib.metadata`` and ``pkg_resources`` (mmengine's ``is_installed``) all see it as
not installed, as in an environment that never had it.
"""
import importlib.util
import json
import os
import site
import subprocess
import sys
import textwrap

import pytest
from conftest import DEMO_DET, DEMO_SEG, ROOT

from deepvit_mm.apis.config import PKG_RESOURCES_GONE
from deepvit_mm.version import TESTED, TOOLBOXES

SITE_PACKAGES = sorted({os.path.realpath(p) for p in site.getsitepackages()})
# per library present: the other's package and distribution, its demo, the other's demo
TOOLBOX = {
    'mmdet': dict(left_out=('mmseg', 'mmsegmentation'), demo=DEMO_DET, other='mmsegmentation',
                  other_demo=DEMO_SEG),
    'mmsegmentation': dict(left_out=('mmdet',), demo=DEMO_SEG, other='mmdet', other_demo=DEMO_DET),
}
NEITHER = ('mmdet', 'mmseg', 'mmsegmentation')
TOOLS = os.path.join(ROOT, 'tools')

pytestmark = pytest.mark.slow  # every test runs deepvit_mm in a fresh interpreter, most the tools


@pytest.fixture(scope='module')
def site_without(tmp_path_factory):
    """``site_without(names)``: a site-packages folder of links to this environment's entries but
    those of the packages and distributions ``names``; made once per ``names``."""
    made = {}

    def make(names) -> str:
        if names not in made:
            folder = tmp_path_factory.mktemp('site')
            for real in SITE_PACKAGES:
                for entry in os.listdir(real):
                    # 'mmseg', 'mmsegmentation-1.2.2.dist-info', 'mmdet', 'mmdet-3.3.0.dist-info'
                    if entry.split('-')[0].split('.')[0] in names or (folder / entry).exists():
                        continue
                    os.symlink(os.path.join(real, entry), folder / entry)
            made[names] = str(folder)
        return made[names]
    return make


def _run_without(site_dir: str, code: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -c code *args`` on the site-packages ``site_dir`` instead of this one's."""
    prelude = textwrap.dedent(f"""
        import os, site, sys
        sys.path[:] = [p for p in sys.path if os.path.realpath(p) not in {SITE_PACKAGES!r}]
        site.addsitedir({site_dir!r})
        """)
    env = {k: v for k, v in os.environ.items() if k not in ('LD_PRELOAD', 'DEEPVIT_MALLOC_RESTARTED')}
    # glibc: the tools would otherwise restart on tcmalloc (the restart runs this code again)
    env.update(PYTHONWARNINGS='ignore', OMP_NUM_THREADS='2', DEEPVIT_MALLOC='glibc', PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, '-c', prelude + textwrap.dedent(code), *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


_MARK = '@@deepvit_mm-test-tool@@'


def _run_tools_without(site_dir: str, *runs, timeout: int = 300) -> list:
    """Each of ``runs``, ``(tool, *args)`` (``tools/<tool>`` or a path), one after the other in
    one interpreter on the site-packages ``site_dir`` (one start of Python and its imports, not
    one a tool): a ``CompletedProcess`` each, with its exit status (``sys.exit(message)``
    printed and 1, as the interpreter does; another exception's traceback printed and 1) and
    what it printed."""
    code = f"""
        import json, runpy, traceback
        codes = []
        for run in json.loads(sys.argv[1]):
            print({_MARK!r}, flush=True)
            print({_MARK!r}, file=sys.stderr, flush=True)
            sys.argv = [os.path.join({TOOLS!r}, run[0])] + run[1:]
            try:
                runpy.run_path(sys.argv[0], run_name='__main__')
                codes.append(0)
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    codes.append(e.code or 0)
                else:
                    print(e.code, file=sys.stderr)
                    codes.append(1)
            except Exception:
                traceback.print_exc()
                codes.append(1)
        sys.stdout.flush()
        sys.stderr.flush()
        print({_MARK!r}, json.dumps(codes), flush=True)
        """
    out = _run_without(site_dir, code, json.dumps([[str(a) for a in run] for run in runs]),
                       timeout=timeout)
    stdout, stderr = out.stdout.split(_MARK + '\n'), out.stderr.split(_MARK + '\n')
    if out.returncode != 0 or len(stdout) != len(runs) + 1:
        raise AssertionError(f'the tools did not all run: {(out.stdout + out.stderr)[-3000:]}')
    last, _, codes = stdout[-1].rpartition(_MARK + ' ')
    stdout[-1] = last
    return [subprocess.CompletedProcess(run, code, o, e)
            for run, code, o, e in zip(runs, json.loads(codes), stdout[1:], stderr[1:])]


def _pip_install(*pkgs: str) -> str:
    return 'pip install -c requirements/constraints.txt ' + ' '.join(
        f'"{pkg}=={TESTED["newest"][pkg]}"' for pkg in pkgs)


def _import_code() -> str:
    """What test_import_registers_in_the_installed_library reads: one line of JSON."""
    return """
        import importlib, json, pkgutil
        import deepvit_mm
        from deepvit_mm.registry import MMDET_MODELS, MMSEG_MODELS, toolbox_registries
        from mmengine.registry import HOOKS
        models = MMDET_MODELS if MMDET_MODELS is not None else MMSEG_MODELS
        constructors = toolbox_registries('OPTIM_WRAPPER_CONSTRUCTORS')
        needs_mmdet = 'deepvit_mm.models.roi_heads'  # and the modules below it
        for m in pkgutil.walk_packages(deepvit_mm.__path__, 'deepvit_mm.'):
            if MMDET_MODELS is not None or not m.name.startswith(needs_mmdet):
                importlib.import_module(m.name)
        try:
            deepvit_mm.CPUSingleRoIExtractor
            roi = 'importable'
        except AttributeError as e:
            roi = str(e)
        print(json.dumps(dict(
            registries=[MMDET_MODELS is not None, MMSEG_MODELS is not None],
            backbones=[models.get(n) is not None for n in ('XCiT', 'CaiT')],
            roi_extractor=models.get('CPUSingleRoIExtractor') is not None, roi=roi,
            constructors=[len(constructors)] + [c.get(n) is not None for c in constructors for n in (
                'ColumnarLayerDecayOptimizerConstructor', 'NoDecayOnScalesOptimizerConstructor')],
            hooks=[HOOKS.get(n) is not None for n in ('CheckConsumersHook', 'FiniteLossHook')],
            loaded=sorted({m.split('.')[0] for m in sys.modules if m.startswith(('mmdet', 'mmseg'))}))))
        """


def _configs_code(toolbox: str, tmp_path) -> str:
    """What test_configs_build_and_the_others_say_what_to_install reads: one line of JSON."""
    other = TOOLBOX[toolbox]['other']
    scope = TOOLBOXES[other]['scope']
    return f"""
        import json
        import deepvit_mm
        from mmengine.config import Config
        from deepvit_mm.apis import (build_from_config, load_config, prepare_config, read_config,
                                        task_registry)
        model, task = build_from_config({TOOLBOX[toolbox]['demo']!r})
        errors = []
        user = os.path.join({str(tmp_path)!r}, 'user.py')  # a user's config on the library's own
        with open(user, 'w') as f:
            f.write("_base_ = '{scope}::_base_/default_runtime.py'\\n")
        for call in (lambda: read_config({TOOLBOX[toolbox]['other_demo']!r}),
                     lambda: read_config(user),
                     lambda: load_config({TOOLBOX[toolbox]['other_demo']!r}),
                     lambda: build_from_config({TOOLBOX[toolbox]['other_demo']!r}),
                     lambda: prepare_config({TOOLBOX[toolbox]['other_demo']!r}),
                     lambda: build_from_config(Config(dict(default_scope={scope!r}, model={{}}))),
                     lambda: task_registry({'seg' if scope == 'mmseg' else 'det'!r})):
            try:
                call()
                errors.append(None)
            except ImportError as e:
                errors.append([type(e).__name__, str(e), e.__context__ is None or e.__suppress_context__])
        print(json.dumps(dict(task=task, backbone=type(model.backbone).__name__, errors=errors)))
        """


@pytest.fixture(scope='module')
def in_toolbox(site_without, tmp_path_factory):
    """``in_toolbox(toolbox)``: one fresh interpreter per toolbox (made once) builds the configs,
    imports every module, then runs tools/train.py and tools/test.py on the other library's demo
    config: what the three tests below read (``configs``, ``imports``: a dict each; ``refused``:
    the two tools' ``CompletedProcess``; ``work``: the work dir they were given)."""
    done = {}

    def run(toolbox):
        if toolbox not in done:
            tmp = tmp_path_factory.mktemp('user')
            probe = tmp / 'probe.py'
            probe.write_text('import os, sys\n' + textwrap.dedent(_configs_code(toolbox, tmp))
                             + textwrap.dedent(_import_code()))
            checkpoint = tmp / 'model.pth'
            checkpoint.write_bytes(b'')  # read only after the config
            args = (TOOLBOX[toolbox]['other_demo'], '--work-dir', tmp / 'work')
            out, *refused = _run_tools_without(
                site_without(TOOLBOX[toolbox]['left_out']), (probe,), ('train.py', *args),
                ('test.py', args[0], checkpoint, *args[1:]))
            assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
            configs, imports = out.stdout.strip().splitlines()[-2:]
            done[toolbox] = dict(configs=json.loads(configs), imports=json.loads(imports),
                                refused=refused, work=tmp / 'work')
        return done[toolbox]
    return run


@pytest.mark.parametrize('toolbox', sorted(TOOLBOX))
def test_import_registers_in_the_installed_library(in_toolbox, toolbox):
    """The backbones, optimizer constructors (and, with mmdet, CPUSingleRoIExtractor) are in the
    installed library's registries; every module of the package but those of the other's models
    imports. ~5-15 s: the toolbox's interpreter (shared with the configs' and the tools' tests)."""
    got = in_toolbox(toolbox)['imports']
    det = toolbox == 'mmdet'
    assert got['registries'] == [det, not det]
    assert got['backbones'] == [True, True] and got['hooks'] == [True, True]
    assert got['constructors'] == [1, True, True]
    assert got['loaded'] == [TOOLBOXES[toolbox]['module']]
    assert got['roi_extractor'] is det
    if det:
        assert got['roi'] == 'importable'
    else:
        assert f'mmdet is not installed: {_pip_install("mmdet")}' in got['roi'], got['roi']


@pytest.mark.parametrize('toolbox', sorted(TOOLBOX))
def test_configs_build_and_the_others_say_what_to_install(in_toolbox, toolbox):
    """The library's demo builds; the other's config, read, loaded, built, prepared for the tools
    or given as a Config, and a user's config inheriting the other's (``mmseg::``), stop with one
    message: what to install. ~5-15 s: the toolbox's interpreter (shared with the import and the
    tools' tests)."""
    other = TOOLBOX[toolbox]['other']
    scope = TOOLBOXES[other]['scope']
    got = in_toolbox(toolbox)['configs']
    assert got['task'] == ('det' if toolbox == 'mmdet' else 'seg') and got['backbone'] == 'XCiT'
    install = f'{other} is not installed: {_pip_install(other)}'
    for i, error in enumerate(got['errors']):
        assert error is not None, i
        name, message, no_chain = error
        assert name == 'ImportError' and no_chain, error
        if i == 1 and importlib.util.find_spec('pkg_resources') is None:
            # mmengine cannot look for the library without pkg_resources (setuptools >= 82)
            assert message.endswith(PKG_RESOURCES_GONE), message
            continue
        assert message.startswith(f'this config is an {other} config (') and install in message, error
    # read: its default_scope; a user's config inheriting the library's own: its _base_
    assert f"(default_scope={scope!r})" in got['errors'][0][1]
    assert f"(its _base_ reads {scope}::)" in got['errors'][1][1] or PKG_RESOURCES_GONE in got['errors'][1][1]
    assert f"(default_scope={scope!r})" in got['errors'][5][1]


@pytest.mark.parametrize('toolbox', sorted(TOOLBOX))
def test_tools_refuse_the_others_configs_in_one_line(in_toolbox, toolbox):
    """With one library left out, tools/train.py and tools/test.py refuse the other's config in one
    line, and make no work dir. ~5-15 s: the toolbox's interpreter (shared with the two tests
    above)."""
    other = TOOLBOX[toolbox]['other']
    got = in_toolbox(toolbox)
    assert [out.args[0] for out in got['refused']] == ['train.py', 'test.py']
    for out in got['refused']:
        assert out.returncode == 1 and 'Traceback' not in out.stderr, out.stderr[-3000:]
        assert out.stderr.strip().splitlines()[-1].startswith(f'this config is an {other} config'), \
            out.stderr[-3000:]
    assert not got['work'].exists()


def _demo_options(toolbox: str, data: str) -> list:
    """--cfg-options of a 2-step run of the demo on tiny data, and of its test."""
    loaders = ['num_workers=0', 'persistent_workers=False']
    if toolbox == 'mmdet':
        return ([f'train_dataloader.dataset.data_root={data}/', 'model.backbone.arch=nano_12_p16',
                 'train_dataloader.batch_size=1', 'train_dataloader.dataset.pipeline.2.scale=(96,64)',
                 'train_dataloader.dataset.pipeline.2.keep_ratio=False',
                 'model.train_cfg.rcnn.sampler.num=32', 'param_scheduler.0.end=1',
                 'param_scheduler.1.begin=1', 'param_scheduler.1.end=2']
                + [f'train_dataloader.{o}' for o in loaders],
                [f'test_dataloader.dataset.data_root={data}/', 'model.backbone.arch=nano_12_p16',
                 f'test_evaluator.ann_file={data}/annotations/instances_val.json']
                + [f'test_dataloader.{o}' for o in loaders])
    return ([f'train_dataloader.dataset.data_root={data}', 'train_dataloader.batch_size=2']
            + [f'train_dataloader.{o}' for o in loaders],
            [f'test_dataloader.dataset.data_root={data}'] + [f'test_dataloader.{o}' for o in loaders])


@pytest.mark.parametrize('toolbox', sorted(TOOLBOX))
def test_tools_train_and_test_the_demo(site_without, toolbox, tmp_path, request):
    """tools/train.py and the library's own train tool each train the library's demo 2 steps,
    tools/test.py evaluates the checkpoint; without ``pkg_resources`` (setuptools >= 82), which
    the recipes' bases do not need. ~20-40 s: a fresh interpreter running the three tools."""
    if toolbox == 'mmdet':
        data = request.getfixturevalue('shapes')
    else:
        from deepvit_tools.demo_data import make_ade_demo
        data = str(tmp_path / 'ade')
        make_ade_demo(data, num_train=4, num_val=1, size=128)
    site_dir = site_without(TOOLBOX[toolbox]['left_out'] + ('pkg_resources',))
    train, test = _demo_options(toolbox, data)
    work = tmp_path / 'work'
    options = ['--cfg-options', *train, 'train_cfg.max_iters=2', 'val_cfg=None', 'val_dataloader=None',
               'val_evaluator=None', 'default_hooks.logger.interval=1',
               'default_hooks.checkpoint.interval=2']
    module = TOOLBOXES[toolbox]['module']
    own = os.path.join(os.path.dirname(importlib.util.find_spec(module).origin), '.mim', 'tools',
                       'train.py')
    # ours first, in the fresh interpreter; the library's own tool last
    ours, out, theirs = _run_tools_without(
        site_dir, ('train.py', TOOLBOX[toolbox]['demo'], '--work-dir', work, *options),
        ('test.py', TOOLBOX[toolbox]['demo'], work / 'iter_2.pth', '--work-dir', work / 'test',
         '--cfg-options', *test),
        (own, TOOLBOX[toolbox]['demo'], '--work-dir', work / module, *options), timeout=600)
    for run in (ours, theirs):
        assert run.returncode == 0, (run.args[0], (run.stdout + run.stderr)[-3000:])
        assert 'Iter(train) [2/2]' in run.stdout + run.stderr, run.args[0]
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    metric = 'coco/bbox_mAP' if toolbox == 'mmdet' else 'mIoU'
    assert f'{metric}:' in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]


def test_import_without_either_says_what_to_install(site_without):
    """With neither mmdet nor mmsegmentation, ``import deepvit_mm`` fails with the pip install to
    run. Slow for its fresh interpreter, on a site-packages folder of links made for this test."""
    out = _run_without(site_without(NEITHER), 'import deepvit_mm')
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith('ImportError: deepvit_mm: neither mmdet nor mmsegmentation is installed'), last
    assert _pip_install('mmdet', 'mmsegmentation') in last
