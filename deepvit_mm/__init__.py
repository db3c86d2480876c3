"""deepvit_mm: XCiT and CaiT as dense-prediction backbones for mmdet 3.x and mmsegmentation 1.x.

Importing the package checks the versions it depends on, registers the backbones in mmdet's and
mmseg's ``MODELS`` (and its hooks, optimizer wrapper and constructor in mmengine's registries),
makes mmengine read checkpoints through the safe loader and load models that hold a deepvit_mm
backbone through its matcher (``deepvit_mm.checkpoints``). Nothing else in the process changes.
"""
from ._deps import check_versions
from .version import __version__

check_versions()

from .backbones import CaiT, ColumnarBackbone, XCiT  # noqa: E402
from .checkpoints import (  # noqa: E402
    CheckpointError,
    install_mmengine_loader,
    load_weights,
    read_checkpoint,
    trusted_checkpoints,
)
from .optim import (  # noqa: E402
    ColumnarLayerDecayOptimizerConstructor,
    NoDecayOnScalesOptimizerConstructor,
)
from .pyramid import ColumnarPyramid  # noqa: E402
from .runtime import (  # noqa: E402
    CheckConsumersHook,
    CPUAmpOptimWrapper,
    CPUDistributedDataParallel,
    CrashSafeCheckpointHook,
    FiniteLossHook,
    RNGStateHook,
)

install_mmengine_loader()


def _register_config_package() -> None:
    """Let mmengine resolve ``_base_ = 'deepvit_mm::configs/<name>.py'``."""
    import os.path as osp

    import mmengine.config.config as mm_config
    from mmengine.config.utils import MODULE2PACKAGE

    # mmengine only resolves `pkg::` for the packages in this table
    MODULE2PACKAGE.setdefault('deepvit_mm', 'deepvit_mm')
    # reason: mmengine 0.10.7 derives a package's folder from its distribution's location, which
    # for an editable (PEP 660) install is site-packages rather than the source tree
    original = mm_config.get_installed_path
    if getattr(original, '_deepvit_mm', False):
        return

    def get_installed_path(package: str) -> str:
        if package == 'deepvit_mm':
            return osp.dirname(osp.abspath(__file__))
        return original(package)

    get_installed_path._deepvit_mm = True
    mm_config.get_installed_path = get_installed_path


_register_config_package()

__all__ = ['__version__', 'XCiT', 'CaiT', 'ColumnarBackbone', 'ColumnarPyramid', 'CheckpointError',
           'CPUAmpOptimWrapper', 'CPUDistributedDataParallel', 'RNGStateHook',
           'CheckConsumersHook', 'CrashSafeCheckpointHook', 'FiniteLossHook',
           'ColumnarLayerDecayOptimizerConstructor', 'NoDecayOnScalesOptimizerConstructor',
           'read_checkpoint', 'load_weights', 'trusted_checkpoints']
