"""Check, before importing them, that the libraries deepvit_mm builds on are in supported ranges.

The ranges (``version.SUPPORTED``) run from the oldest to the newest stack CI tests
(``version.TESTED``); a message outside them names both stacks and how to set one up. mmdet and
mmsegmentation (``version.TOOLBOXES``) are each optional, one of them is needed. Known to
break inside the ranges, and checked here: numpy 2 beside a torch compiled against numpy 1 (torch
2.1 cannot exchange arrays with it; pip pulls numpy 2 in through the newest opencv-python).
"""
import functools
import sys
from importlib import metadata
from typing import Dict, List, Optional, Tuple

from .version import ALSO_TESTED, FLOORS, LIMITS, PYTHON, SUPPORTED, TESTED, TOOLBOXES, release, supported

__all__ = ['check_versions', 'installed_toolboxes', 'toolbox_install', 'missing_toolbox_message']

FIX = (f'Set up a tested stack: `make setup` (torch {TESTED["newest"]["torch"]}) or `make setup '
       f'STACK=torch2.1` (torch {TESTED["torch2.1"]["torch"]}, numpy < 2), or in an existing '
       'environment pin the rest with its constraints: '
       'pip install -c requirements/constraints.txt -e ".[all]"  (torch 2.1: '
       '-c requirements/constraints-torch2.1.txt; mmcv: MMCV_WITH_OPS=1 pip install '
       '--no-build-isolation mmcv==2.1.0, or OpenMMLab\'s wheel for your torch)')


def tested_versions(pkg: str) -> str:
    """``'2.1.0, 2.14.1 and 2.15.0'``: the versions of ``pkg`` in the tested stacks and
    ``ALSO_TESTED``."""
    versions = {s[pkg] for s in TESTED.values()} | ({ALSO_TESTED[pkg]} if pkg in ALSO_TESTED else set())
    versions = sorted(versions, key=release)
    return ' and '.join(versions) if len(versions) < 3 else \
        ', '.join(versions[:-1]) + ' and ' + versions[-1]


def _version(pkg: str, installed: Optional[Dict[str, Optional[str]]] = None) -> Optional[str]:
    if installed is not None:
        return installed.get(pkg)
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def installed_toolboxes(installed: Optional[Dict[str, Optional[str]]] = None) -> List[str]:
    """The distributions of ``TOOLBOXES`` installed (``'mmdet'``, ``'mmsegmentation'``), in its
    order; ``installed`` (distribution -> version or None) instead of the environment's."""
    if installed is None:
        return list(_toolboxes_here())
    return [pkg for pkg in TOOLBOXES if _version(pkg, installed) is not None]


@functools.cache
def _toolboxes_here() -> Tuple[str, ...]:
    """The environment's answer, looked up once a process: every registration asks, and each
    metadata lookup scans the distributions on ``sys.path``."""
    return tuple(pkg for pkg in TOOLBOXES if _version(pkg) is not None)


def toolbox_install(*pkgs: str) -> str:
    """The command that installs ``pkgs`` of ``TOOLBOXES`` at their tested versions, e.g.
    ``pip install -c requirements/constraints.txt "mmsegmentation==1.2.2" (torch 2.1 stack: ...)``."""
    specs = []
    for pkg in pkgs:
        versions = {s[pkg] for s in TESTED.values()}
        lo, hi = SUPPORTED[pkg]
        specs.append(f'"{pkg}=={versions.pop()}"' if len(versions) == 1 else f'"{pkg}>={lo},<{hi}"')
    files = {name: s['files'][1] for name, s in TESTED.items()}
    return (f'pip install -c {files["newest"]} {" ".join(specs)} (torch 2.1 stack: '
            f'-c {files["torch2.1"]})')


def missing_toolbox_message(scope: str, why: Optional[str] = None) -> Optional[str]:
    """None if the library of configs with ``default_scope=scope`` is installed (or ``scope`` is
    none of ``TOOLBOXES``'), else what to install: ``this config is an mmsegmentation config
    (default_scope='mmseg') and mmsegmentation is not installed: pip install ...``; ``why``
    replaces ``default_scope='mmseg'``."""
    for pkg, toolbox in TOOLBOXES.items():
        if toolbox['scope'] == scope and pkg not in installed_toolboxes():
            return (f'this config is an {pkg} config ({why or f"default_scope={scope!r}"}) and '
                    f'{pkg} is not installed: {toolbox_install(pkg)}')
    return None


def python_range(lo: str = PYTHON[0], hi: str = PYTHON[1]) -> str:
    """``'3.10 to 3.13'``: the Pythons from ``lo`` up to, not including, ``hi`` (minor releases)."""
    major, minor = (int(x) for x in hi.split('.'))
    return f'{lo} to {major}.{minor - 1}'


def python_problem(python: Optional[str] = None) -> Optional[str]:
    """None if Python ``python`` (``'3.12'``; default: this one) is in ``version.PYTHON``, else
    what is wrong."""
    python = python or '.'.join(map(str, sys.version_info[:2]))
    if supported('python', python):
        return None
    newest = '.'.join(TESTED['newest']['torch'].split('.')[:2])
    why = (f'torch {newest} publishes no wheels for it' if release(python) < release(PYTHON[0])
           else 'not tested')
    return f'Python {python} is not supported (need Python {python_range()}): {why}'


def version_problems(installed: Optional[Dict[str, Optional[str]]] = None,
                     python: Optional[str] = None) -> List[str]:
    """One line per dependency that is missing or outside ``SUPPORTED`` (Python ``python``, default
    this one, first); ``TOOLBOXES`` are optional, but one of them is needed."""
    problem = python_problem(python)
    problems = [problem] if problem else []
    for pkg, (lo, hi) in SUPPORTED.items():
        v = _version(pkg, installed)
        need = f'need >={lo},<{hi}; tested: {tested_versions(pkg)}'
        if v is None and pkg in TOOLBOXES:
            continue
        if v is None:
            problems.append(f'{pkg} is not installed ({need})')
        elif not supported(pkg, v):
            reasons = LIMITS if release(v) >= release(lo) else FLOORS
            why = f': {reasons[pkg]}' if pkg in reasons else ''
            problems.append(f'{pkg} {v} is not supported ({need}){why}')
    if not installed_toolboxes(installed):
        names = ' nor '.join(TOOLBOXES)
        problems.append(f'neither {names} is installed: deepvit_mm needs one of them, the one '
                        f'whose configs you run, or both: {toolbox_install(*TOOLBOXES)}')
    return problems


def numpy_problem() -> Optional[str]:
    """None if torch can exchange arrays with the installed numpy, else what to do."""
    import numpy as np
    import torch
    try:
        torch.from_numpy(np.zeros(1))
        return None
    except RuntimeError as e:  # "Numpy is not available": torch built against numpy 1.x
        return (f'torch {torch.__version__} cannot use numpy {np.__version__} ({e}): it was '
                'compiled against numpy 1.x. Install numpy < 2 with an opencv-python that accepts '
                'it, in one command: pip install "numpy<2" "opencv-python<4.12"')


def check_versions() -> None:
    problems = version_problems()
    if problems:
        raise ImportError('deepvit_mm: ' + '; '.join(problems) + '. ' + FIX)
    problem = numpy_problem()
    if problem:
        raise ImportError('deepvit_mm: ' + problem)
