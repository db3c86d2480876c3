"""deepvit_mm: XCiT and CaiT as dense-prediction backbones for mmdet 3.x and mmsegmentation 1.x.

Importing the package checks the versions it depends on, registers the backbones in mmdet's and
mmseg's ``MODELS`` and makes mmengine read checkpoints through the safe loader.
"""
from ._deps import check_versions
from .version import __version__

check_versions()

from .backbones import ColumnarBackbone, XCiT  # noqa: E402
from .checkpoints import CheckpointError, install_mmengine_loader, read_checkpoint  # noqa: E402
from .engine import CPUAmpOptimWrapper, RNGStateHook  # noqa: E402
from .pyramid import ColumnarPyramid  # noqa: E402

install_mmengine_loader()

__all__ = ['__version__', 'XCiT', 'ColumnarBackbone', 'ColumnarPyramid', 'CheckpointError',
           'CPUAmpOptimWrapper', 'RNGStateHook',
           'read_checkpoint']
