"""tools/setup_env.sh (``make setup``) takes the Pythons of version.py's PYTHONS for each stack and
refuses any other before it makes anything; a virtualenv made by another Python is made again.
Run on a copy of the files it reads, with ``SETUP_CHECK_ONLY=1`` (it stops before installing)."""
import glob
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from deepvit_mm.version import PYTHONS

HERE = '{}.{}'.format(*sys.version_info[:2])


def _takes(stack: str, python: str) -> bool:
    lo, hi = (tuple(map(int, v.split('.'))) for v in PYTHONS[stack])
    return lo <= tuple(map(int, python.split('.'))) < hi


@pytest.fixture
def tree(tmp_path):
    """A copy of what the script reads: itself, deepvit_mm/version.py, requirements/."""
    for rel in ('tools/setup_env.sh', 'deepvit_mm/version.py'):
        os.makedirs(tmp_path / os.path.dirname(rel), exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), tmp_path / rel)
    shutil.copytree(os.path.join(ROOT, 'requirements'), tmp_path / 'requirements')
    return tmp_path


def _setup(tree, python: str, stack: str = 'newest', path=None) -> subprocess.CompletedProcess:
    """The script's answer with ``PYTHON=python`` ('' names none: python3 on ``path``)."""
    env = {k: v for k, v in os.environ.items() if k not in ('VIRTUAL_ENV', 'PYTHON')}
    env.update(SETUP_CHECK_ONLY='1', STACK=stack)
    if python:
        env['PYTHON'] = python
    if path:
        env['PATH'] = f'{path}:{env["PATH"]}'
    return subprocess.run(['bash', str(tree / 'tools' / 'setup_env.sh')], env=env,
                          capture_output=True, text=True, timeout=120)


def _pyenv_python(version: str):
    """pyenv's interpreter of Python ``version`` (X.Y), if this machine has one."""
    root = os.environ.get('PYENV_ROOT', os.path.expanduser('~/.pyenv'))
    found = sorted(glob.glob(os.path.join(root, 'versions', f'{version}.*', 'bin', f'python{version}')))
    return found[-1] if found else None


@pytest.mark.parametrize('stack', sorted(PYTHONS))
def test_this_python_is_taken_or_refused_as_pythons_says(tree, stack):
    run = _setup(tree, sys.executable, stack)
    if _takes(stack, HERE):
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip().splitlines()[-1] == \
            f'[setup] {".venv" if stack == "newest" else ".venv-torch2.1"} with Python {HERE}'
    else:
        assert run.returncode == 2 and run.stdout == '', run
        lo, hi = PYTHONS[stack]
        major, minor = map(int, hi.split('.'))
        assert run.stderr.strip() == (
            f'[setup] Python {HERE} ({sys.executable}) cannot set up STACK={stack}: it takes Python '
            f'{lo} to {major}.{minor - 1}; name one, e.g. make setup PYTHON=python{major}.{minor - 1}')
    assert not glob.glob(str(tree / '.venv*'))  # nothing made


def test_python_39_is_refused_before_anything_is_made(tree):
    python = _pyenv_python('3.9')
    if python is None:
        pytest.skip('no Python 3.9 here')
    run = _setup(tree, python)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run
    assert 'Python 3.9' in run.stderr and 'it takes Python 3.10 to 3.13' in run.stderr
    assert not glob.glob(str(tree / '.venv*'))


def test_an_interpreter_that_is_not_there_is_named(tree):
    run = _setup(tree, 'python-that-is-not-there')
    assert run.returncode == 2 and run.stderr.strip() == (
        "[setup] no working Python interpreter 'python-that-is-not-there': name one with PYTHON=, "
        'e.g. make setup PYTHON=python3.12')


def _venv_of(tree, stack: str, python: str):
    """A virtualenv of the stack whose interpreter is ``python``."""
    venv = tree / ('.venv' if stack == 'newest' else '.venv-torch2.1')
    os.makedirs(venv / 'bin')
    os.symlink(python, venv / 'bin' / 'python')
    return venv


def test_a_virtualenv_of_another_python_is_kept_unless_one_is_named(tree, tmp_path):
    """With no Python named, a working .venv of another Python the stack takes is kept, and said
    so; naming a Python makes it again with that one."""
    stack = 'newest'
    other = next((p for v in ('3.12', '3.13', '3.11', '3.10') if v != HERE and _takes(stack, v)
                  for p in [_pyenv_python(v)] if p), None)
    if other is None or not _takes(stack, HERE):
        pytest.skip('needs two Pythons of the newest stack')
    other_version = os.path.basename(other)[len('python'):]
    venv = _venv_of(tree, stack, other)
    bin_dir = tmp_path / 'bin'
    os.makedirs(bin_dir)
    os.symlink(sys.executable, bin_dir / 'python3')
    run = _setup(tree, '', stack, path=bin_dir)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines() == [
        f'[setup] keeping .venv, made by Python {other_version} (python3 is {HERE}); make setup '
        f'PYTHON=python3 makes it again with that one', f'[setup] .venv with Python {other_version}']
    run = _setup(tree, sys.executable, stack)
    assert run.stdout.strip() == (f'[setup] .venv was made by Python {other_version}, not {HERE} '
                                  f'({sys.executable}): making it again')
    assert os.path.islink(venv / 'bin' / 'python')  # SETUP_CHECK_ONLY: said, not done


def test_a_virtualenv_whose_python_is_gone_is_made_again(tree, tmp_path):
    """A .venv whose interpreter no longer runs is not reused, with a Python named or not."""
    stack = 'newest' if _takes('newest', HERE) else 'torch2.1'
    venv = tree / ('.venv' if stack == 'newest' else '.venv-torch2.1')
    os.makedirs(venv / 'bin')
    (venv / 'bin' / 'python').write_text('#!/bin/sh\nexit 1\n')  # its Python was removed
    os.chmod(venv / 'bin' / 'python', 0o755)
    bin_dir = tmp_path / 'bin'
    os.makedirs(bin_dir)
    os.symlink(sys.executable, bin_dir / 'python3')
    for named, shown in ((sys.executable, sys.executable), ('', 'python3')):
        run = _setup(tree, named, stack, path=bin_dir)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == (f'[setup] {venv.name} was made by Python none, not {HERE} '
                                      f'({shown}): making it again')
    assert (venv / 'bin' / 'python').exists()  # SETUP_CHECK_ONLY: said, not done


def test_a_second_set_up_returns_at_once_unless_the_environment_changed(tree, tmp_path):
    """The fast path: the stamp of the last set-up (the requirements, and every distribution's
    version in the environment) matches, and the script returns without pip; a distribution
    added since (as ``pip install`` would) sends it back to installing. Run in an active
    virtualenv whose python is this one, with ``-m pip`` refused and counted."""
    shutil.copy(os.path.join(ROOT, 'setup.py'), tree / 'setup.py')
    venv, site = tmp_path / 'venv', tmp_path / 'site'
    (venv / 'bin').mkdir(parents=True)
    site.mkdir()
    python = venv / 'bin' / 'python'
    python.write_text(f'#!/usr/bin/env bash\n[ "$1 $2" != "-m pip" ] || {{ echo PIP "$@"; exit 3; }}\n'
                      f'PYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHON', 'FORCE_CUDA', 'MMCV_CUDA_ARCH', 'TORCH_CUDA_ARCH_LIST')}
    env.update(VIRTUAL_ENV=str(venv), STACK='newest' if _takes('newest', HERE) else 'torch2.1')
    # the requirements, and what a CUDA build is asked for (FORCE_CUDA, the archs): none here
    want = subprocess.run(['bash', '-c', '(cat requirements/*.txt setup.py deepvit_mm/version.py; '
                           'echo "0  ") | sha256sum | cut -c1-16'], cwd=tree, capture_output=True,
                          text=True, check=True).stdout.strip()

    def setup(installed: str) -> subprocess.CompletedProcess:
        (venv / '.deepvit_mm.stamp').write_text(f'{want}-{installed}\n')
        return subprocess.run(['bash', str(tree / 'tools' / 'setup_env.sh')], env=env,
                              capture_output=True, text=True, timeout=120)

    # what the script computes of this environment: a stamp it does not take sends it to pip
    first = setup('0' * 16)
    assert first.returncode != 0 and 'PIP -m pip install' in first.stdout, first.stdout + first.stderr
    now = subprocess.run([str(python), '-c', 'import hashlib, importlib.metadata as m; print('
                          'hashlib.sha256("\\n".join(sorted("%s==%s" % (d.metadata["Name"], '
                          'd.version) for d in m.distributions())).encode()).hexdigest()[:16])'],
                         cwd=tree, capture_output=True, text=True, check=True).stdout.strip()
    same = setup(now)
    assert same.returncode == 0 and 'PIP' not in same.stdout, same.stdout + same.stderr
    (site / 'added-1.0.dist-info').mkdir()
    (site / 'added-1.0.dist-info' / 'METADATA').write_text('Name: added\nVersion: 1.0\n')
    changed = setup(now)
    assert changed.returncode != 0 and 'PIP -m pip install' in changed.stdout, changed.stdout


# mmcv 2.1.0's setup.py, the lines tools/mmcv_build.py mends (as released on the registry)
MMCV_SETUP = """\
def get_version():
    version_file = 'mmcv/version.py'
    with open(version_file, encoding='utf-8') as f:
        exec(compile(f.read(), version_file, 'exec'))
    return locals()['__version__']

        if platform.system() != 'Windows':
            if parse_version(torch.__version__) <= parse_version('1.12.1'):
                extra_compile_args['cxx'] = ['-std=c++14']
            else:
                extra_compile_args['cxx'] = ['-std=c++17']
            extra_compile_args['cxx'] = ['-Wall', '-std=c++17']
                extra_compile_args['nvcc'] += ['-std=c++17']
"""


def _mmcv_build():
    sys.path.insert(0, os.path.join(ROOT, 'tools'))
    try:
        import mmcv_build
    finally:
        sys.path.pop(0)
    return mmcv_build


@pytest.mark.parametrize('torch_version,cxx', [
    ('2.1.0', 'c++17'), ('2.13.0+cpu', 'c++17'), ('2.14.1', 'c++20'), ('2.15.0+cu132', 'c++20'),
    ('2.16.0.dev20270101', 'c++20')])
def test_mmcv_source_is_mended_for_python_and_torch(torch_version, cxx):
    """get_version reads the exec's own namespace (Python 3.13, PEP 667); from torch 2.14 every
    -std=c++17 (g++ and nvcc) becomes -std=c++20, whose headers need it; C++14 stays; a second
    mend changes nothing."""
    mmcv_build = _mmcv_build()
    text = mmcv_build.mend(MMCV_SETUP, torch_version)
    ns = {}
    exec(text.split('\n\n')[0], ns)  # get_version, mended, reads a version file
    assert "return ns['__version__']" in text and "locals()" not in text
    assert text.count(f"'-std={cxx}'") == 3 and text.count("'-std=c++14'") == 1, text
    assert mmcv_build.mend(text, torch_version) == text


def test_another_setup_py_is_refused_in_one_line(tmp_path):
    setup_py = tmp_path / 'setup.py'
    setup_py.write_text("from setuptools import setup\nsetup(name='x')\n")
    run = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'mmcv_build.py'), 'mend',
                          str(setup_py)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.strip().count('\n') == 0, run.stderr
    assert "is this mmcv 2.1.0's setup.py?" in run.stderr
    assert setup_py.read_text() == "from setuptools import setup\nsetup(name='x')\n"


def test_the_mmcv_ops_check_passes_here_and_catches_a_wrong_op(monkeypatch):
    """The installed mmcv's nms and RoIAlign pass the set-up's check; an nms that keeps the
    overlapping box fails it."""
    import mmcv.ops
    mmcv_build = _mmcv_build()
    mmcv_build.check_ops()
    monkeypatch.setattr(mmcv.ops, 'nms', lambda boxes, scores, iou_threshold: (boxes, torch.arange(3)))
    with pytest.raises(RuntimeError, match=r'nms kept boxes \[0, 1, 2\], not \[0, 2\]'):
        mmcv_build.check_ops()


@pytest.mark.slow
def test_torch_headers_take_the_standard_the_mend_gives():
    """The cause of the mend, on the installed torch: its ATen headers compile (g++ -fsyntax-only)
    under the standard ``mend`` leaves, and from torch 2.14 refuse C++17 with the C++20 error.
    Two compiles of ATen.h, ~15 s of CPU."""
    from torch.utils.cpp_extension import include_paths
    mmcv_build = _mmcv_build()
    cxx20 = mmcv_build.needs_cxx20(torch.__version__)
    flags = [f'-I{p}' for p in include_paths()]

    def compiles(std):
        return subprocess.run(['g++', '-fsyntax-only', f'-std={std}', *flags, '-x', 'c++', '-'],
                              input='#include <ATen/ATen.h>\nint main() { return 0; }\n',
                              capture_output=True, text=True, timeout=600)
    given = compiles('c++20' if cxx20 else 'c++17')
    assert given.returncode == 0, given.stderr[-2000:]
    if cxx20:
        old = compiles('c++17')
        assert old.returncode != 0 and 'C++20 or later' in old.stderr, old.stderr[-2000:]
