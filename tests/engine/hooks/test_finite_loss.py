"""``FiniteLossHook``: a non-finite loss stops training, naming non-finite images when the batch
holds them after the data preprocessor (the backbones read their input's values on their first
call only). The whole run: test_resume.py's test_non_finite_loss_stops_training."""
import types

import pytest
import torch
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmdet.structures import DetDataSample

from deepvit_mm import FiniteLossHook


def _runner(tmp_path, std):
    model = torch.nn.Module()
    model.data_preprocessor = DetDataPreprocessor(mean=[0, 0, 0], std=std)
    return types.SimpleNamespace(model=model, work_dir=str(tmp_path), iter=6)


def _batch():
    return dict(inputs=[torch.zeros(3, 8, 8, dtype=torch.uint8)], data_samples=[DetDataSample()])


@pytest.mark.parametrize('std,named', [([0, 1, 1], True), ([1, 1, 1], False)],
                         ids=['std 0', 'finite images'])
def test_a_non_finite_loss_names_non_finite_images(tmp_path, std, named):
    hook = FiniteLossHook()
    runner = _runner(tmp_path, std)
    hook.after_train_iter(runner, 0, _batch(), dict(loss=torch.tensor(1.0)))  # finite: nothing
    with pytest.raises(FloatingPointError) as e:
        hook.after_train_iter(runner, 0, _batch(), dict(loss=torch.tensor(float('nan'))))
    message = str(e.value)
    assert message.startswith('training stopped: at iteration 7 the loss is not finite (loss=nan)')
    images = 'The images hold 64 NaN or infinite values after the data preprocessor: check its ' \
             'mean and std (a std of 0)'
    assert (images in message) == named, message
