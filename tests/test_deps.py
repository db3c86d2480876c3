"""`import deepvit_mm` checks the versions it depends on and says what to do."""
import re

import pytest

from deepvit_mm import XCiT
from deepvit_mm._deps import FIX, numpy_problem, version_problems
from deepvit_mm.version import ALSO_TESTED, LIMITS, SUPPORTED, TESTED, TOOLBOXES


def _stack(name):
    return {k: v for k, v in TESTED[name].items() if k in SUPPORTED}


def test_installed_stack_is_supported():
    assert version_problems() == [] and numpy_problem() is None


@pytest.mark.parametrize('stack', sorted(TESTED))
def test_every_tested_stack_is_supported_and_spans_the_range(stack):
    assert set(_stack(stack)) == set(SUPPORTED)
    assert version_problems(_stack(stack)) == []


def test_range_ends_at_the_tested_versions():
    """The lower bound is the oldest tested release; the upper admits only patch releases of the
    newest tested minor (a stack's, or one the whole suite ran on once: ``ALSO_TESTED``)."""
    for pkg, (lo, hi) in SUPPORTED.items():
        tested = sorted(tuple(int(x) for x in v.split('.'))
                        for v in {s[pkg] for s in TESTED.values()} | set(ALSO_TESTED.get(pkg, '').split()))
        assert tuple(int(x) for x in lo.split('.')) == tested[0], pkg
        newest = tested[-1]
        assert tuple(int(x) for x in hi.split('.')) == (newest[0], newest[1] + 1, 0), pkg


def test_constraints_files_pin_the_tested_stacks():
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, stack in TESTED.items():
        text = ''.join(open(os.path.join(root, f)).read() for f in stack['files'])
        pins = dict(re.findall(r'^([A-Za-z0-9_.-]+)===?([^\s#]+)', text, re.M))
        # the constraints never pin torch: installing with them keeps an environment's own torch
        with open(os.path.join(root, stack['files'][1])) as f:
            assert not re.search(r'^(torch|torchvision)[=<>]', f.read(), re.M), name
        for pkg in ('torch', 'torchvision', 'numpy', 'mmcv', 'mmengine', 'mmdet', 'mmsegmentation',
                    'timm'):
            assert pins[pkg] == stack[pkg], (name, pkg)



def test_docs_tested_stacks_table_is_version_py():
    """docs/install.md's table of the tested stacks says what version.py's TESTED pins."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, 'docs', 'install.md')) as f:
        rows = {m.group(1): [c.strip() for c in m.group(2).split('|')]
                for m in re.finditer(r'^\| `(\w[\w.]*)`[^|]*\|(.*)\|$', f.read(), flags=re.M)}
    assert sorted(rows) == sorted(TESTED)
    for name, s in TESTED.items():
        assert rows[name][:6] == [f"{s['torch']} / {s['torchvision']}", s['numpy'], s['mmcv'],
                                  s['mmengine'], f"{s['mmdet']} / {s['mmsegmentation']}",
                                  s['timm']], name
        with open(os.path.join(root, s['files'][1])) as f:
            setuptools = re.search(r'^setuptools==(\S+)', f.read(), re.M).group(1)
        assert rows[name][7:] == [s['python'], setuptools], name

@pytest.mark.parametrize('pkg,version,expect', [
    ('mmcv', '2.2.0', 'mmcv 2.2.0 is not supported (need >=2.1.0,<2.2.0; tested: 2.1.0): mmdet 3.3.0'),
    ('torch', '2.16.0', 'torch 2.16.0 is not supported (need >=2.1.0,<2.16.0; tested: 2.1.0, 2.14.1 '
                        'and 2.15.0)'),
    ('torch', '2.16.0rc1', 'torch 2.16.0rc1 is not supported (need >=2.1.0,<2.16.0; tested: 2.1.0, '
                           '2.14.1 and 2.15.0)'),
    ('torch', '2.16.0.dev20260101+cpu', 'torch 2.16.0.dev20260101+cpu is not supported'),
    ('torch', '2.0.1', 'torch 2.0.1 is not supported (need >=2.1.0,<2.16.0; tested: 2.1.0, 2.14.1 and '
                       '2.15.0): torch 2.0 lacks what this package calls: torch.utils.checkpoint.'
                       'set_checkpoint_early_stop'),
    ('torch', '2.1.0rc1', 'torch 2.1.0rc1 is not supported (need >=2.1.0,'),
    ('timm', '1.0.16rc2', 'timm 1.0.16rc2 is not supported (need >=1.0.16,<1.1.0; tested: 1.0.16 and '
                          '1.0.31): timm before 1.0.16 ignores gradient checkpointing'),
    ('mmengine', '0.10.2', 'mmengine 0.10.2 is not supported (need >=0.10.3,<0.11.0; tested: 0.10.3 '
                           'and 0.10.7)'),
    ('timm', '1.0.15', 'timm 1.0.15 is not supported (need >=1.0.16,<1.1.0; tested: 1.0.16 and '
                       '1.0.31): timm before 1.0.16 ignores gradient checkpointing'),
    ('mmdet', '2.28.2', 'mmdet 2.28.2 is not supported'),
    ('mmsegmentation', '0.30.0', 'mmsegmentation 0.30.0 is not supported'),
    ('timm', None, 'timm is not installed'),
])
def test_unsupported_versions_named(pkg, version, expect):
    problems = version_problems(dict(_stack('newest'), **{pkg: version}))
    assert len(problems) == 1 and problems[0].startswith(expect)
    if pkg == 'mmcv':  # a limit's reason is given only above the range
        assert problems[0].endswith(LIMITS['mmcv'])


@pytest.mark.parametrize('python,expect', [
    ('3.9', 'Python 3.9 is not supported (need Python 3.10 to 3.13): torch 2.14 publishes no '
            'wheels for it'),
    ('3.14', 'Python 3.14 is not supported (need Python 3.10 to 3.13): not tested'),
    ('3.10', None), ('3.13', None)])
def test_python_outside_the_tested_range_is_named(python, expect):
    """As an unsupported torch: ``import deepvit_mm`` stops with it (setup.py's python_requires
    says the same to pip)."""
    assert version_problems(_stack('newest'), python=python) == ([expect] if expect else [])


@pytest.mark.parametrize('left_out', [('mmdet',), ('mmsegmentation',)])
def test_mmdet_and_mmsegmentation_are_each_optional(left_out):
    """One of them is enough (tests/test_one_toolbox.py runs deepvit_mm so); one present outside
    its range is still refused."""
    stack = dict(_stack('newest'), **{pkg: None for pkg in left_out})
    assert version_problems(stack) == []
    (present,) = set(TOOLBOXES) - set(left_out)
    (problem,) = version_problems(dict(stack, **{present: '0.1.0'}))
    assert problem.startswith(f'{present} 0.1.0 is not supported')


def test_neither_mmdet_nor_mmsegmentation_says_what_to_install():
    (problem,) = version_problems(dict(_stack('newest'), mmdet=None, mmsegmentation=None))
    assert problem.startswith('neither mmdet nor mmsegmentation is installed') and \
        'pip install -c requirements/constraints.txt "mmdet==3.3.0" "mmsegmentation==1.2.2" ' \
        '(torch 2.1 stack: -c requirements/constraints-torch2.1.txt)' in problem, problem


@pytest.mark.parametrize('pkg,version', [
    ('torch', '2.1.0'), ('torch', '2.1.0+cu118'), ('torch', '2.1.2+cu121'), ('torch', '2.13.0+cpu'),
    ('torch', '2.14.1'), ('torch', '2.15.0+cu132'), ('torch', '2.15.1'), ('torch', '2.14.0rc1'),
    ('torchvision', '0.16.0+cu118'), ('torchvision', '0.29.2'),
    ('timm', '1.0.31'), ('timm', '1.0.20.dev0'), ('mmengine', '0.10.7.post1')])
def test_supported_versions_by_pep440(pkg, version):
    """Local builds and pre-/post-releases inside the range are accepted (compared by
    ``packaging``, not by their digits: ``1.0.16rc2`` once read as ``1.0.162``)."""
    assert version_problems(dict(_stack('newest'), **{pkg: version})) == []


def test_fix_says_what_to_run():
    assert 'STACK=torch2.1' in FIX and 'constraints-torch2.1.txt' in FIX and 'MMCV_WITH_OPS=1' in FIX


def test_numpy_that_torch_cannot_use_is_named(monkeypatch):
    import torch

    def no_numpy(a):  # what torch 2.1.2 raises beside numpy 2 (measured: numpy 2.2.6)
        raise RuntimeError('Numpy is not available')
    monkeypatch.setattr(torch, 'from_numpy', no_numpy)
    assert re.search(r'cannot use numpy .*compiled against numpy 1\.x.*pip install "numpy<2" '
                     r'"opencv-python<4.12"', numpy_problem())


@pytest.mark.parametrize('torch_version,refused', [
    ((2, 1, 2), True), ((2, 5, 1), True), ((2, 12, 9), True), ((2, 13, 0), False),
    ((2, 13, 1), False)])
def test_onnx_export_needs_the_torch_it_was_measured_on(monkeypatch, torch_version, refused):
    """torch 2.1 has no dynamo exporter; torch 2.5.1 has one that fails on these models (measured:
    6 of the export tests failed there); only the measured torch exports."""
    import deepvit_mm.deploy.export as export
    monkeypatch.setattr(export, 'TORCH_VERSION', torch_version)
    problem = export.onnx_dynamo_export_problem()
    assert (problem is not None) == refused
    if refused:
        assert 'tested with torch 2.13.0' in problem and "torch 2.5.1's fails" in problem \
            and 'requirements/constraints.txt' in problem


def test_arch_fixed_arguments_refused():
    with pytest.raises(ValueError, match="patch_size is fixed by arch='small_12_p16'.*valid:"):
        XCiT('small_12_p16', patch_size=4)


@pytest.mark.slow
def test_the_installed_package_never_imports_the_tools_library():
    """deepvit_mm is the product: importing every one of its modules loads nothing of
    deepvit_tools (the measuring harness and demo-data generators beside tools/), which setup.py
    does not install."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ('import importlib, pkgutil, sys, deepvit_mm\n'
            'names = [m.name for m in pkgutil.walk_packages(deepvit_mm.__path__, "deepvit_mm.")]\n'
            'for n in names: importlib.import_module(n)\n'
            'print(len(names), sorted(m for m in sys.modules if m.split(".")[0] == "deepvit_tools"))')
    out = subprocess.run([sys.executable, '-c', code], cwd=root, capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0, out.stderr[-3000:]
    count, loaded = out.stdout.split(' ', 1)
    files = [f for d, _, fs in os.walk(os.path.join(root, 'deepvit_mm')) if '.mim' not in d
             for f in fs if f.endswith('.py')]
    assert int(count) == len(files) - 1 and loaded.strip() == '[]', out.stdout  # every module


# the libraries whose versions deepvit_mm supports a range of (version.SUPPORTED), and numpy
_LIBRARIES = ('torch', 'torchvision', 'timm', 'mmengine', 'mmcv', 'mmdet', 'mmseg', 'numpy')


def _reaches_into_libraries(path) -> list:
    """Where a module names another library's private API (``torch._C``, ``from torch.x import
    _Y``) or assigns to an attribute of one of its modules (a patch)."""
    import ast
    tree = ast.parse(path.read_text())
    names = {}  # local name -> library module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split('.')[0] in _LIBRARIES:
                    names[a.asname or a.name.split('.')[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and \
                node.module.split('.')[0] in _LIBRARIES:
            for a in node.names:
                if a.name.startswith('_') or any(p.startswith('_') for p in node.module.split('.')):
                    found.append(f'{path}:{node.lineno}: from {node.module} import {a.name}')
                names[a.asname or a.name] = f'{node.module}.{a.name}'

    def library_object(node) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in names

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith('_') and \
                not node.attr.startswith('__') and library_object(node.value):
            found.append(f'{path}:{node.lineno}: {ast.unparse(node)}')
        targets = node.targets if isinstance(node, ast.Assign) else []
        found += [f'{path}:{node.lineno}: {ast.unparse(t)} = ...' for t in targets
                  if isinstance(t, ast.Attribute) and library_object(t.value)]
    return found


# Another library's private API (``torch._C``, ``from torch.x import _Y``) and every change made to
# one are named in one module: ``compat/`` where more than one part of deepvit_mm needs it (a
# difference between releases), else the module of its one user. Each such module and what it
# reaches, so that a new one is a decision:
REACHES_INTO_LIBRARIES = {
    'checkpoints/mmengine_hooks.py': ['mm_ckpt.load_state_dict = ...'],
    'checkpoints/reading.py': ['HistoryBuffer._statistics_methods'],
    'checkpoints/unpickling.py': ['from torch import _weights_only_unpickler',
                                  'wou._get_allowed_globals'],
    'config_package.py': ['mm_config.get_installed_path = ...', 'mm_config.is_installed = ...',
                          'mm_hub.get_installed_path = ...', 'mm_hub.install_package = ...'],
    'engine/distributed/fsdp.py': [
        'from mmengine._strategy import FSDPStrategy',
        'from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype',
        'torch._foreach_norm'],
    'engine/optimizers/optim_wrapper_constructors.py': [
        'from torch.nn.modules.batchnorm import _NormBase'],
    'models/backbones/grad_checkpointing.py': ['torch._C._current_graph_task_id', 'torch._C'],
    'models/layers.py': ['from torch.nn.modules.batchnorm import _BatchNorm',
                         'from torch.nn.modules.conv import _ConvNd'],
    'tracing.py': ['torch._dynamo'],
}


def test_private_apis_and_patches_of_other_libraries_are_named_once():
    """No module of deepvit_mm names a private attribute of torch, timm, mmengine, mmcv, mmdet,
    mmseg or numpy, or assigns to one of their modules' attributes, but those
    ``REACHES_INTO_LIBRARIES`` lists; outside ``compat/`` no two parts reach the same one."""
    import pathlib
    package = pathlib.Path(__file__).resolve().parents[1] / 'deepvit_mm'
    found = {p.relative_to(package).as_posix(): [f.split(': ', 1)[1] for f in
                                                 _reaches_into_libraries(p)]
             for p in sorted(package.rglob('*.py'))}
    assert {k: v for k, v in found.items() if v} == REACHES_INTO_LIBRARIES
    parts = {}
    for path, reached in found.items():
        for what in reached if path.split('/')[0] != 'compat' else []:
            parts.setdefault(what, set()).add(path.split('/')[0])
    assert {what: p for what, p in parts.items() if len(p) > 1} == {}, 'shared: belongs in compat'


def test_ci_runs_each_stack_on_its_python_and_setup_takes_the_pythons_of_version_py():
    """.ci/run sets the newest stack up on the newest Python it takes, the oldest on the oldest
    (version.py's TESTED python, ends of PYTHONS), and tools/setup_env.sh reads PYTHONS itself."""
    import os

    from deepvit_mm._deps import python_range
    from deepvit_mm.version import PYTHON, PYTHONS
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, '.ci', 'run')) as f:
        ci = f.read()
    for name, stack in TESTED.items():
        flag = '' if name == 'newest' else f' STACK={name}'
        assert re.search(rf'PYTHON=\$\(python_of {re.escape(stack["python"])}\)\n.*\n.*'
                         rf'make test{flag} PYTHON="\$PYTHON"', ci), name
    assert TESTED['newest']['python'] == python_range(*PYTHONS['newest']).split(' to ')[1]
    assert TESTED['torch2.1']['python'] == PYTHONS['torch2.1'][0] == PYTHON[0]
    assert PYTHONS['newest'][1] == PYTHON[1]
    with open(os.path.join(root, 'tools', 'setup_env.sh')) as f:
        assert "'PYTHONS'" in f.read()


def test_the_environment_has_pkg_resources():
    """mmengine 0.10 resolves ``_base_ = 'mmdet::...'`` through ``pkg_resources`` and openmim
    0.3.9 imports it at start-up; setuptools 82 removed it. The package requires what setup.py
    says (``setuptools<82``) and the installed setuptools meets it, so every route of the README
    ends with it: ``make setup`` on both stacks, the constraints routes, a plain ``pip install``."""
    import importlib.util
    import os
    from importlib import metadata

    from packaging.requirements import Requirement
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, 'setup.py')) as f:
        (line,) = re.findall(r"'(setuptools[<>=!][^']*)'", f.read())
    assert metadata.version('setuptools') in Requirement(line).specifier, line
    assert importlib.util.find_spec('pkg_resources') is not None
    for stack in TESTED.values():  # and both stacks pin one that has it
        with open(os.path.join(root, stack['files'][1])) as f:
            pinned = re.search(r'^setuptools==(\S+)', f.read(), re.M).group(1)
        assert pinned in Requirement(line).specifier, (stack['files'][1], pinned)
