"""deepvit_mm: XCiT, CaiT and timm's other columnar transformers as dense-prediction backbones
for mmdet 3.x and mmsegmentation 1.x.

What ``import deepvit_mm`` changes outside its own objects (docs/install.md lists the same):

* It checks the installed versions and stops with what to install outside the tested range.
* Registries: its backbones in mmdet's and mmseg's ``MODELS`` (those of the two installed), with
  mmdet a RoI extractor; the norm layer ``LN2d`` (timm's ``LayerNorm2d``) in mmengine's; its
  hooks, optimizer wrapper and constructors in mmengine's registries and the installed
  libraries'. New names only: nothing registered is replaced.
* mmengine's config: ``_base_ = 'deepvit_mm::...'`` and ``mmengine.hub.get_config`` resolve to
  this package, with or without ``pkg_resources`` (mmengine's ``MODULE2PACKAGE``, and its config
  module's ``get_installed_path`` and ``is_installed``, its hub's ``get_installed_path`` and
  ``install_package``, each for the name ``deepvit_mm`` only).
* mmengine's checkpoint loading (``deepvit_mm.checkpoints``): its reader for local paths and
  ``http(s)://`` URLs becomes the safe, verifying loader, for every model (it refuses code in
  pickles and corrupted files, and reads hub names); its ``load_state_dict`` hands the models that
  hold a deepvit_mm backbone to the matcher (key mapping, one report), every other model to
  mmengine's own. ``DEEPVIT_MM_KEEP_MMENGINE_LOADER=1`` in the environment keeps mmengine's
  loaders as they are; ``deepvit_mm.install_mmengine_loader()`` installs them later.

Later, only when used: ``CPUAmpOptimWrapper`` (mixed precision on CPU) makes mmcv's compiled ops
run in float32 while CPU autocast is on (``deepvit_mm.engine.optimizers.mmcv_ops_in_float32``).
"""
import os

from ._deps import check_versions, installed_toolboxes, toolbox_install
from .version import __version__

check_versions()

from .checkpoints import (  # noqa: E402
    CheckpointError,
    install_mmengine_loader,
    load_weights,
    read_checkpoint,
    trusted_checkpoints,
)
from .config_package import register_config_package  # noqa: E402
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
from .models import (  # noqa: E402
    CaiT,
    ColumnarBackbone,
    ColumnarPyramid,
    TimmBEiT,
    TimmEVA,
    TimmViT,
    XCiT,
)

if os.environ.get('DEEPVIT_MM_KEEP_MMENGINE_LOADER', '') in ('', '0'):
    install_mmengine_loader()
register_config_package('deepvit_mm', __path__[0])  # `_base_ = 'deepvit_mm::configs/...'`

__all__ = ['__version__', 'XCiT', 'CaiT', 'TimmViT', 'TimmEVA', 'TimmBEiT', 'ColumnarBackbone',
           'ColumnarPyramid', 'CheckpointError',
           'CPUAmpOptimWrapper', 'CPUDistributedDataParallel', 'RNGStateHook',
           'CheckConsumersHook', 'CrashSafeCheckpointHook', 'FiniteLossHook',
           'ColumnarLayerDecayOptimizerConstructor', 'NoDecayOnScalesOptimizerConstructor',
           'read_checkpoint', 'load_weights', 'trusted_checkpoints', 'install_mmengine_loader']

if 'mmdet' in installed_toolboxes():
    from .models.roi_heads import CPUSingleRoIExtractor  # noqa: F401  (in __all__)
    __all__.append('CPUSingleRoIExtractor')


def __getattr__(name: str):
    if name == 'CPUSingleRoIExtractor':  # only here without mmdet
        raise AttributeError(f'deepvit_mm.CPUSingleRoIExtractor extends mmdet\'s RoI extractor, '
                             f'and mmdet is not installed: {toolbox_install("mmdet")}')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
