"""`import deepvit_mm` checks the versions it depends on and says what to do."""
import pytest

from deepvit_mm import XCiT
from deepvit_mm._deps import FIX, version_problems
from deepvit_mm.version import SUPPORTED

GOOD = {'torch': '2.13.0+cpu', 'torchvision': '0.28.0', 'mmcv': '2.1.0', 'mmengine': '0.10.7',
        'mmdet': '3.3.0', 'mmsegmentation': '1.2.2', 'timm': '1.0.31'}


def test_installed_stack_is_supported():
    assert version_problems() == []


def test_good_versions_pass():
    assert version_problems(GOOD) == []


@pytest.mark.parametrize('pkg,version,expect', [
    ('mmcv', '2.2.0', 'mmcv 2.2.0 is not supported (need >=2.0.0,<2.2.0)'),
    ('torch', '2.14.1', 'torch 2.14.1 is not supported'),
    ('mmdet', '2.28.2', 'mmdet 2.28.2 is not supported'),
    ('mmsegmentation', '0.30.0', 'mmsegmentation 0.30.0 is not supported'),
    ('timm', None, 'timm is not installed'),
])
def test_unsupported_versions_named(pkg, version, expect):
    problems = version_problems(dict(GOOD, **{pkg: version}))
    assert len(problems) == 1 and problems[0].startswith(expect)
    assert set(SUPPORTED) == set(GOOD)


def test_fix_says_what_to_run():
    assert 'constraints.txt' in FIX and 'MMCV_WITH_OPS=1' in FIX


def test_arch_fixed_arguments_refused():
    with pytest.raises(ValueError, match="patch_size is fixed by arch='small_12_p16'.*valid:"):
        XCiT('small_12_p16', patch_size=4)
