"""Check, before importing them, that the libraries deepvit_mm builds on are in supported ranges."""
from importlib import metadata
from typing import Dict, List, Optional, Tuple

from .version import SUPPORTED

__all__ = ['check_versions', 'version_problems']

FIX = ('Run the README set-up (`make test` or `bash tools/setup_env.sh`), or install the pinned '
       'versions: pip install -c requirements/constraints.txt -e .  (mmcv: MMCV_WITH_OPS=1 pip '
       'install --no-build-isolation mmcv==2.1.0)')


def _parse(v: str) -> Tuple[int, ...]:
    out = []
    for part in v.split('+')[0].split('.')[:3]:
        digits = ''.join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out + [0] * (3 - len(out)))


def version_problems(installed: Optional[Dict[str, Optional[str]]] = None) -> List[str]:
    """One line per dependency that is missing or outside ``SUPPORTED``."""
    problems = []
    for pkg, (lo, hi) in SUPPORTED.items():
        if installed is not None:
            v = installed.get(pkg)
        else:
            try:
                v = metadata.version(pkg)
            except metadata.PackageNotFoundError:
                v = None
        if v is None:
            problems.append(f'{pkg} is not installed (need >={lo},<{hi})')
        elif not _parse(lo) <= _parse(v) < _parse(hi):
            problems.append(f'{pkg} {v} is not supported (need >={lo},<{hi})')
    return problems


def check_versions() -> None:
    problems = version_problems()
    if problems:
        raise ImportError('deepvit_mm: ' + '; '.join(problems) + '. ' + FIX)
