"""The package's version, and the library releases it is tested on and accepts (read by setup.py)."""
from packaging.specifiers import SpecifierSet
from packaging.version import Version

__version__ = '0.1.0'

# The two stacks CI installs and runs the whole test suite on (`.ci/run`: `make test` and
# `make test STACK=torch2.1`), each pinned in full by its two files: torch, and the rest.
# torch2.1: torch 2.1.0, the release OpenMMLab's prebuilt mmcv 2.1.0 wheels for torch 2.1 are built
# against, so the stack most mmdet 3 / mmseg 1 users have, with the oldest mmengine and timm
# accepted. newest: today's releases.
TESTED = {
    'torch2.1': dict(files=('requirements/torch2.1.txt', 'requirements/constraints-torch2.1.txt'),
                     python='3.10', torch='2.1.0', torchvision='0.16.0', numpy='1.26.4', mmcv='2.1.0',
                     mmengine='0.10.3', mmdet='3.3.0', mmsegmentation='1.2.2', timm='1.0.16'),
    'newest': dict(files=('requirements/torch.txt', 'requirements/constraints.txt'),
                   python='3.13', torch='2.14.1', torchvision='0.29.1', numpy='2.4.6', mmcv='2.1.0',
                   mmengine='0.10.7', mmdet='3.3.0', mmsegmentation='1.2.2', timm='1.0.31'),
}

# Releases newer than the newest stack's that the whole suite ran on once, outside CI, each in a
# virtualenv that held it before the set-up ran (docs/install.md#how-long-the-suite-takes): the
# range reaches their minor's patch releases.
ALSO_TESTED = {'torch': '2.15.0', 'torchvision': '0.29.2'}

# The Pythons (lower inclusive, upper exclusive) each stack is set up and tested on; CI runs each
# stack on its `python` above, the ends of these ranges. torch 2.1 publishes no wheels beyond
# Python 3.11, torch 2.14 none below 3.10. tools/setup_env.sh reads this table (as a literal,
# without importing anything) and refuses any other Python before it installs anything.
PYTHONS = {
    'torch2.1': ('3.10', '3.12'),
    'newest': ('3.10', '3.14'),
}
# The Pythons `import deepvit_mm` and pip (setup.py's python_requires) accept: the stacks' union.
PYTHON = ('3.10', '3.14')

# What `import deepvit_mm` accepts: from the oldest tested release up to and including the patch
# releases of the newest tested minor (TESTED and ALSO_TESTED; lower inclusive, upper exclusive).
# Releases in between the two stacks take the code paths of one of them (each part picks by
# feature, not by version, except FEATURE_FLOORS below); what is known to break in between is
# checked by deepvit_mm/_deps.py.
SUPPORTED = {
    'torch': ('2.1.0', '2.16.0'),
    'torchvision': ('0.16.0', '0.30.0'),
    'mmcv': ('2.1.0', '2.2.0'),
    'mmengine': ('0.10.3', '0.11.0'),
    'mmdet': ('3.3.0', '3.4.0'),
    'mmsegmentation': ('1.2.2', '1.3.0'),
    'timm': ('1.0.16', '1.1.0'),
}
# The OpenMMLab toolboxes (their own word for mmdet and mmseg) whose models the backbones go into,
# each optional (``import deepvit_mm`` needs one or both): its module, the ``default_scope`` of its
# configs, and setup.py's extra installing it.
TOOLBOXES = {
    'mmdet': dict(module='mmdet', scope='mmdet', extra='det'),
    'mmsegmentation': dict(module='mmseg', scope='mmseg', extra='seg'),
}


def release(version: str) -> Version:
    """``'2.1.0+cu118'`` -> ``Version('2.1.0+cu118')``: a version parsed as PEP 440 reads it
    (``packaging``), so that pre-releases, post-releases and local builds compare right."""
    return Version(version)


def supported(pkg: str, version: str) -> bool:
    """Whether ``import deepvit_mm`` accepts ``version`` of ``pkg`` (``'python'``: of Python, in
    ``PYTHON``): within ``SUPPORTED[pkg]`` (lower inclusive, upper exclusive) by PEP 440, local
    builds (``+cu118``) included; a pre-release is accepted inside the range, never one of the
    upper bound (``2.16.0rc1`` is outside ``<2.16.0``)."""
    lo, hi = PYTHON if pkg == 'python' else SUPPORTED[pkg]
    return SpecifierSet(f'>={lo},<{hi}').contains(version, prereleases=True)


# Why the range ends where it does, where more than "not tested" is known
# (docs/install.md#supported-versions).
LIMITS = {
    'mmcv': 'mmdet 3.3.0 and mmsegmentation 1.2.2 refuse mmcv >= 2.2.0 at import',
}
# Why the range starts where it does, where more than "not tested" is known.
FLOORS = {
    'torch': 'torch 2.0 lacks what this package calls: torch.utils.checkpoint.'
             'set_checkpoint_early_stop (with_cp=True, as the CaiT Mask R-CNN recipes train, fails), '
             'torch.utils.flop_counter (the FLOPs tools) and torch.backends.cpu (the CPU precision '
             'choice); measured with torch 2.0.1 and mmcv 2.0.1',
    'timm': 'timm before 1.0.16 ignores gradient checkpointing in XCiT\'s and CaiT\'s '
            'forward_intermediates, so with_cp=True would silently keep every activation',
}
# Features that need a newer release than the rest of the package: the lowest release tested
# working, and what is known below it (docs/install.md#supported-versions).
FEATURE_FLOORS = {
    'ONNX export': ('torch', '2.13.0',
                    'torch 2.1 has no torch.onnx.export(dynamo=True); torch 2.5.1\'s fails '
                    '(torch.export cannot take symbolic sizes through the adapter\'s baddbmm, '
                    'onnxscript cannot translate BatchNorm); releases in between are not tested'),
    'sharded training on CPU': ('torch', '2.13.0',
                                "torch 2.1.2's FullyShardedDataParallel fails on CPU processes "
                                "(TypeError: Stream() takes no arguments); releases in between "
                                'are not tested'),
}
