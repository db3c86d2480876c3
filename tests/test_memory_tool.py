"""The train-step memory measurement behind tools/memory_train_step.py (plumbing only: the
numbers themselves are measured in fresh processes by the tool)."""
import math
import os

import pytest

from deepvit_mm.memory import measure_train_step, peak_rss_mib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_measure_train_step_of_the_demo_detector():
    cfg = os.path.join(ROOT, 'configs', 'demo', 'mask_rcnn_xcit_nano_12_p8_shapes.py')
    r = measure_train_step(cfg, with_cp=True, height=64, width=96, num_objects=2,
                           cfg_options={'model.backbone.arch': 'nano_12_p16'})
    assert r['with_cp'] is True and (r['height'], r['width']) == (64, 96)
    assert math.isfinite(r['loss'])
    assert 0 < r['before_step_mib'] <= r['peak_rss_mib'] <= peak_rss_mib() + 0.1  # rounded
    assert r['step_peak_mib'] == pytest.approx(r['peak_rss_mib'] - r['before_step_mib'], abs=0.2)
