"""``deepvit_mm::`` config paths: ``_base_ = 'deepvit_mm::configs/...'`` and
``mmengine.hub.get_config('deepvit_mm::...')``, set up by ``import deepvit_mm``.

mmengine (0.10.3 to 0.10.x; tested: 0.10.3 and 0.10.7) resolves ``pkg::`` only for the packages
in its ``MODULE2PACKAGE`` table; 0.10.7 derives a package's folder from its distribution's
location, which for an editable (PEP 660) install is site-packages rather than the source tree;
and its ``is_installed`` and ``get_installed_path`` import ``pkg_resources``, which setuptools 82
removed. ``register_config_package`` makes the config module's ``is_installed`` and
``get_installed_path`` and the hub's ``get_installed_path`` and ``install_package`` (a no-op for
an installed package) answer for the registered package only, without ``pkg_resources``; every
other name goes to mmengine's own.
"""
import os.path as osp
from typing import Any, Callable

__all__ = ['register_config_package']

_MARK = '_deepvit_mm'


def register_config_package(package: str, path: str) -> None:
    """Let mmengine's configs and hub resolve ``package::<file>`` to ``path/<file>``, without
    ``pkg_resources``. Idempotent."""
    import mmengine.config.config as mm_config
    import mmengine.hub.hub as mm_hub
    from mmengine.config.utils import MODULE2PACKAGE
    MODULE2PACKAGE.setdefault(package, package)
    if getattr(mm_config.get_installed_path, _MARK, False):
        return
    folder = osp.abspath(path)
    mm_config.get_installed_path = _answer_for(package, folder, mm_config.get_installed_path)
    mm_config.is_installed = _answer_for(package, True, mm_config.is_installed)
    mm_hub.get_installed_path = _answer_for(package, folder, mm_hub.get_installed_path)
    mm_hub.install_package = _answer_for(package, None, mm_hub.install_package)


def _answer_for(package: str, answer: Any, original: Callable[[str], Any]) -> Callable[[str], Any]:
    """``original`` (an mmengine function of a package name), answering ``answer`` for
    ``package``."""
    def for_package(name: str) -> Any:
        return answer if name == package else original(name)

    setattr(for_package, _MARK, True)
    for_package.__name__ = original.__name__
    for_package.__doc__ = original.__doc__
    return for_package
