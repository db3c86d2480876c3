"""deepvit_mm: XCiT and CaiT backbones for mmdet 3.x and mmsegmentation 1.x.

torch/torchvision and mmcv are not install_requires: torch's build is machine-specific and mmcv
must be compiled against the installed torch (see tools/setup_env.sh). ``import deepvit_mm``
checks them and says what to do.
"""
import os
import os.path as osp
import shutil
import sys

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))


def add_mim_extension():
    """Ship configs/ as ``deepvit_mm/.mim/configs/configs`` so that
    ``_base_ = 'deepvit_mm::configs/<name>.py'`` resolves in an installed package (mmengine looks
    in ``<package>/.mim/configs`` and wants a folder in the name), as mmdet and mmseg do.
    Editable installs link the repo's folder; builds copy it."""
    src = osp.join(HERE, 'configs')
    dst_root = osp.join(HERE, 'deepvit_mm', '.mim', 'configs')
    dst = osp.join(dst_root, 'configs')
    if not osp.isdir(src):
        return
    os.makedirs(dst_root, exist_ok=True)
    if osp.islink(dst) or osp.isfile(dst):
        os.remove(dst)
    elif osp.isdir(dst):
        shutil.rmtree(dst)
    # mmengine reads <package>/.mim/model-index.yml before it falls back to the config path
    with open(osp.join(HERE, 'deepvit_mm', '.mim', 'model-index.yml'), 'w') as f:
        f.write('Import: []\n')
    editable = any(a in sys.argv for a in ('develop', 'editable_wheel'))
    if editable:
        os.symlink(osp.relpath(src, dst_root), dst)
    else:
        shutil.copytree(src, dst)


add_mim_extension()

setup(
    name='deepvit_mm',
    version='0.1.0',
    description='XCiT and CaiT as detection/segmentation backbones for mmdet 3.x and mmseg 1.x',
    long_description=open(osp.join(HERE, 'README.md'), encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    packages=find_packages(include=['deepvit_mm', 'deepvit_mm.*']),
    include_package_data=True,
    package_data={'deepvit_mm': ['.mim/model-index.yml', '.mim/configs/configs/*.py',
                                 '.mim/configs/configs/**/*.py']},
    install_requires=[
        'mmengine>=0.10,<1.0',
        'mmdet>=3.0,<3.4',
        'mmsegmentation>=1.0,<1.3',
        'timm>=1.0.9',
        'safetensors',
        'pycocotools',
        'ftfy',  # mmseg.utils imports them
        'regex',
    ],
    # deploy: ONNX export (torch.onnx's exporter needs onnxscript) and ONNX Runtime; the test
    # command installs it too (tools/setup_env.sh), since tests/test_deploy.py needs it
    extras_require={'tests': ['pytest', 'ruff'],
                    'deploy': ['onnx', 'onnxruntime', 'onnxscript']},
    license='Apache-2.0',
)
