"""deepvit_mm: XCiT, CaiT and timm's ViT family (ViT, DeiT, DINOv2, EVA-02, BEiT) as backbones for
mmdet 3.x and mmsegmentation 1.x.

torch/torchvision and mmcv are not install_requires: torch's build is machine-specific and mmcv
must be compiled against the installed torch (see tools/setup_env.sh). ``import deepvit_mm``
checks them and says what to do. The other libraries' ranges are ``deepvit_mm/version.py``'s
``SUPPORTED``, the ones ``import deepvit_mm`` accepts, so that pip refuses what import would.
mmdet and mmsegmentation (``TOOLBOXES``) are each optional, one is needed: the extras ``det``,
``seg`` and ``all`` (both) install them, e.g. ``pip install -c requirements/constraints.txt -e
".[all]"``.
"""
import os
import os.path as osp
import re
import shutil
import sys

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))


def _version_py() -> dict:
    """``deepvit_mm/version.py``'s names, read without importing the package (its import needs
    torch)."""
    ns = {}
    with open(osp.join(HERE, 'deepvit_mm', 'version.py'), encoding='utf-8') as f:
        exec(f.read(), ns)
    return ns


def _requirements(*pkgs: str) -> list:
    """``pkg>=lo,<hi`` for each of ``pkgs``, from ``version.SUPPORTED``."""
    supported = _version_py()['SUPPORTED']
    return [f'{pkg}>={supported[pkg][0]},<{supported[pkg][1]}' for pkg in pkgs]


def _toolbox_extras() -> dict:
    """One extra per library of ``version.TOOLBOXES`` (``det``: mmdet, ``seg``: mmsegmentation),
    with what its import needs beside it, and ``all``: both."""
    needs = {'mmdet': ['pycocotools'],
             'mmsegmentation': ['ftfy', 'regex']}  # mmseg.utils imports them
    extras = {toolbox['extra']: _requirements(pkg) + needs[pkg]
              for pkg, toolbox in _version_py()['TOOLBOXES'].items()}
    extras['all'] = [r for reqs in extras.values() for r in reqs]
    return extras


def _mim_files() -> list:
    """Every file under ``deepvit_mm/.mim``, named one by one: setuptools before 62.3 ignores
    ``**`` in ``package_data``, so a glob would build a wheel without the nested configs."""
    mim = osp.join(HERE, 'deepvit_mm', '.mim')
    return sorted(osp.relpath(osp.join(d, f), osp.join(HERE, 'deepvit_mm'))
                  for d, _, files in os.walk(mim, followlinks=True) if '__pycache__' not in d
                  for f in files if f.endswith(('.py', '.sh', '.yml')))


def _mim_metafile(text: str) -> str:
    """A metafile as ``.mim`` holds it: mim and mmengine read ``Config:`` relative to ``.mim``,
    where the recipes are under ``configs/configs`` (see ``add_mim_extension``)."""
    return re.sub(r'^(\s*Config:\s*)configs/', r'\1configs/configs/', text, flags=re.M)


def add_mim_extension():
    """Fill ``deepvit_mm/.mim`` with what mim and mmengine read there, as mmdet and mmseg do:

    * ``configs/`` as ``.mim/configs/configs``, so that ``_base_ = 'deepvit_mm::configs/<name>.py'``
      resolves in an installed package (mmengine looks in ``<package>/.mim/configs`` and wants a
      folder in the name);
    * ``tools/`` as ``.mim/tools`` (``mim train`` / ``mim test`` run ``.mim/tools/train.py``,
      ``test.py``);
    * ``model-index.yml`` and ``metafiles/`` (``mim search deepvit_mm``; mmengine's
      ``get_config('deepvit_mm::configs/<name>.py')`` and ``mim download`` take the weights from
      them), with each ``Config:`` pointing at ``configs/configs/<name>.py``.

    Editable installs link configs/ and tools/; builds copy them.
    """
    mim = osp.join(HERE, 'deepvit_mm', '.mim')
    if not osp.isdir(osp.join(HERE, 'configs')):
        return  # an sdist being built again: .mim came with it
    editable = any(a in sys.argv for a in ('develop', 'editable_wheel'))
    for src, dst in (('configs', osp.join('configs', 'configs')), ('tools', 'tools')):
        src, dst = osp.join(HERE, src), osp.join(mim, dst)
        os.makedirs(osp.dirname(dst), exist_ok=True)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if editable:
            os.symlink(osp.relpath(src, osp.dirname(dst)), dst)
        else:
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__'))
    metafiles = osp.join(mim, 'metafiles')
    shutil.rmtree(metafiles, ignore_errors=True)
    os.makedirs(metafiles)
    for name in sorted(os.listdir(osp.join(HERE, 'metafiles'))):
        with open(osp.join(HERE, 'metafiles', name), encoding='utf-8') as f:
            text = _mim_metafile(f.read())
        with open(osp.join(metafiles, name), 'w', encoding='utf-8') as f:
            f.write(text)
    shutil.copyfile(osp.join(HERE, 'model-index.yml'), osp.join(mim, 'model-index.yml'))


add_mim_extension()

setup(
    name='deepvit_mm',
    version='0.1.0',
    description=('XCiT, CaiT and timm\'s ViT family (ViT, DeiT, DINOv2, EVA-02, BEiT) as '
                 'detection/segmentation backbones for mmdet 3.x and mmseg 1.x'),
    long_description=open(osp.join(HERE, 'README.md'), encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>={},<{}'.format(*_version_py()['PYTHON']),
    packages=find_packages(include=['deepvit_mm', 'deepvit_mm.*']),
    include_package_data=True,
    package_data={'deepvit_mm': _mim_files()},
    install_requires=_requirements('mmengine', 'timm') + [
        'packaging',  # deepvit_mm.version compares versions by PEP 440
        'safetensors',
        'filelock',  # one download per cache (deepvit_mm.checkpoints.fetch)
        # pkg_resources, gone from setuptools 82: mmengine 0.10 (its last) resolves a config's
        # `_base_ = 'mmdet::...'` through it, and mim starts only with it (docs/install.md)
        'setuptools<82',
    ],
    extras_require={
        # mmdet and/or mmsegmentation: `.[det]`, `.[seg]`, `.[all]` (import needs one of them)
        **_toolbox_extras(),
        # `mim train|test|search deepvit_mm ...`; opendatalab 0.0.10, openmim's newest pick,
        # requires openxlab, which pins setuptools 60.2.0 (a downgrade of the user's)
        'mim': ['openmim', 'opendatalab<0.0.10'],
        # ONNX export (torch.onnx's exporter needs onnxscript) and ONNX Runtime
        'deploy': ['onnx', 'onnxruntime', 'onnxscript'],
        # tests/tools/test_zoo.py runs mim and checks the FLOPs against fvcore's count;
        # tools/train.py and tools/test.py --vis-backend tensorboard; pytest-xdist: `make test`
        # runs the test files on 2 processes
        # seaborn: mmdet's and mmseg's analyze_logs.py import it (tests/visualization/test_curves.py)
        'tests': ['pytest', 'pytest-xdist', 'ruff', 'openmim', 'opendatalab<0.0.10', 'fvcore', 'tensorboard',
                  'seaborn'],
    },
    license='Apache-2.0',
)
