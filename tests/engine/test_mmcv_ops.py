"""A model on a GPU that calls mmcv's compiled ops, beside an mmcv compiled without CUDA, is
stopped before its run with one line naming the ops and ``make setup``; a CPU model, a CUDA mmcv
and a model calling none of them pass. Which ops each stock architecture calls is checked
against what its training and prediction ran in tests/models/test_architectures.py."""
import os

import mmcv.ops
import pytest
import torch
from conftest import CONFIG_DIR, DEMO_DET, build_model
from mmengine.config import Config

from deepvit_mm.engine import mmcv_ops_device_problem
from deepvit_mm.engine.mmcv_ops import mmcv_ops_used

SEG = os.path.join(CONFIG_DIR, 'upernet_xcit_t12_16_160k_ade20k.py')


@pytest.fixture(scope='module')
def detector():
    return build_model(Config.fromfile(DEMO_DET), device='meta')


@pytest.fixture(scope='module')
def segmentor():
    return build_model(Config.fromfile(SEG), device='meta')


def test_the_demo_detector_calls_roi_align_and_nms(detector, segmentor):
    assert mmcv_ops_used(detector) == ['RoIAlign', 'nms']
    assert mmcv_ops_used(segmentor) == []


@pytest.mark.parametrize('built,device,stops', [
    ('not available', 'cuda', True), ('13.0', 'cuda', False), ('not available', 'cpu', False)])
def test_a_gpu_detector_beside_a_cpu_mmcv_stops_in_one_line(monkeypatch, detector, segmentor,
                                                            built, device, stops):
    monkeypatch.setattr(mmcv.ops, 'get_compiling_cuda_version', lambda: built)
    problem = mmcv_ops_device_problem(detector, torch.device(device))
    if not stops:
        assert problem is None
        return
    assert problem is not None and '\n' not in problem
    assert "calls mmcv's RoIAlign, nms" in problem and 'compiled without CUDA ops' in problem
    assert '`make setup` on this machine' in problem and torch.__version__ in problem
    assert mmcv_ops_device_problem(segmentor, torch.device(device)) is None  # UperNet: none


def test_the_device_is_the_models_own(monkeypatch):
    """Without a device named, the model's first parameter says where it runs (here the CPU)."""
    monkeypatch.setattr(mmcv.ops, 'get_compiling_cuda_version', lambda: 'not available')
    model = torch.nn.Sequential(mmcv.ops.RoIAlign((2, 2)), torch.nn.Linear(2, 2))
    assert mmcv_ops_used(model) == ['RoIAlign']
    assert mmcv_ops_device_problem(model) is None
    assert 'RoIAlign' in mmcv_ops_device_problem(model, torch.device('cuda'))


def test_a_model_not_built_yet_is_passed():
    """mmengine's FlexibleRunner (sharded training) builds its model when the run starts: before,
    ``runner.model`` is the config, which the check lets through."""
    from mmengine.config import ConfigDict
    assert mmcv_ops_device_problem(ConfigDict(type='MaskRCNN'), torch.device('cuda')) is None
