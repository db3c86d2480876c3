"""deepvit_mm: XCiT and CaiT as dense-prediction backbones for mmdet 3.x and mmsegmentation 1.x.

Importing the package checks the versions it depends on, registers the backbones in mmdet's and
mmseg's ``MODELS``, in those of the two that are installed (one is needed; with mmdet, a RoI
extractor that is faster on CPU in its ``MODELS``; its hooks, optimizer wrapper and constructors in
mmengine's registries and the installed ones'), makes mmengine read checkpoints
through the safe loader and load models that hold a deepvit_mm backbone through its matcher
(``deepvit_mm.checkpoints``). Nothing else in the process changes.
"""
from ._deps import check_versions, family_install, installed_families
from .version import __version__

check_versions()

from .checkpoints import (  # noqa: E402
    CheckpointError,
    install_mmengine_loader,
    load_weights,
    read_checkpoint,
    trusted_checkpoints,
)
from .compat.mmengine import register_config_package  # noqa: E402
from .engine import (  # noqa: E402
    CheckConsumersHook,
    ColumnarLayerDecayOptimizerConstructor,
    CPUAmpOptimWrapper,
    CPUDistributedDataParallel,
    CrashSafeCheckpointHook,
    FiniteLossHook,
    NoDecayOnScalesOptimizerConstructor,
    RNGStateHook,
)
from .models import CaiT, ColumnarBackbone, ColumnarPyramid, XCiT  # noqa: E402

install_mmengine_loader()
register_config_package('deepvit_mm', __path__[0])  # `_base_ = 'deepvit_mm::configs/...'`

__all__ = ['__version__', 'XCiT', 'CaiT', 'ColumnarBackbone', 'ColumnarPyramid', 'CheckpointError',
           'CPUAmpOptimWrapper', 'CPUDistributedDataParallel', 'RNGStateHook',
           'CheckConsumersHook', 'CrashSafeCheckpointHook', 'FiniteLossHook',
           'ColumnarLayerDecayOptimizerConstructor', 'NoDecayOnScalesOptimizerConstructor',
           'read_checkpoint', 'load_weights', 'trusted_checkpoints']

if 'mmdet' in installed_families():
    from .models.roi_heads import CPUSingleRoIExtractor  # noqa: F401  (in __all__)
    __all__.append('CPUSingleRoIExtractor')


def __getattr__(name: str):
    if name == 'CPUSingleRoIExtractor':  # only here without mmdet
        raise AttributeError(f'deepvit_mm.CPUSingleRoIExtractor extends mmdet\'s RoI extractor, '
                             f'and mmdet is not installed: {family_install("mmdet")}')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
