"""The embedded demo dataset: valid COCO, deterministic, loadable by mmdet, clear errors."""
import json
import os

import pytest
from conftest import ROOT

from deepvit_tools.demo_data import DatasetError, make_shapes_coco
from deepvit_tools.demo_data.shapes import SHAPE_CLASSES, check_coco_dataset


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('shapes'))
    make_shapes_coco(root, num_train=8, num_val=4, size=128, seed=0)
    return root


def _json(root, split):
    with open(os.path.join(root, 'annotations', f'instances_{split}.json')) as f:
        return json.load(f)


def test_layout_and_counts(shapes):
    counts = check_coco_dataset(shapes)
    assert counts['train']['images'] == 8 and counts['val']['images'] == 4
    assert counts['train']['objects'] >= 8  # at least one visible object an image, usually more
    coco = _json(shapes, 'train')
    assert [c['name'] for c in coco['categories']] == list(SHAPE_CLASSES)


def test_annotations_are_consistent(shapes):
    import numpy as np
    from pycocotools import mask as mask_utils
    for split in ('train', 'val'):
        coco = _json(shapes, split)
        sizes = {im['id']: (im['height'], im['width']) for im in coco['images']}
        for ann in coco['annotations']:
            h, w = sizes[ann['image_id']]
            x, y, bw, bh = ann['bbox']
            assert 0 <= x and 0 <= y and x + bw <= w and y + bh <= h and bw > 0 and bh > 0
            rle = mask_utils.merge(mask_utils.frPyObjects(ann['segmentation'], h, w))
            poly_area = float(mask_utils.area(rle))
            assert poly_area == pytest.approx(ann['area'], rel=0.35)
            assert 1 <= ann['category_id'] <= 3
            assert np.isfinite(poly_area)


def test_deterministic(tmp_path, shapes):
    a, b = str(tmp_path / 'a'), str(tmp_path / 'b')
    make_shapes_coco(a, num_train=8, num_val=4, size=128, seed=0)
    make_shapes_coco(b, num_train=8, num_val=4, size=128, seed=1)
    assert _json(a, 'train') == _json(shapes, 'train')
    with open(os.path.join(a, 'train', '000000.png'), 'rb') as f1, \
            open(os.path.join(shapes, 'train', '000000.png'), 'rb') as f2:
        assert f1.read() == f2.read()
    assert _json(b, 'train') != _json(a, 'train')
    assert _json(a, 'val') != _json(a, 'train')  # val is another stream


def test_existing_dataset_not_rewritten(shapes):
    ann = os.path.join(shapes, 'annotations', 'instances_train.json')
    before = os.stat(ann).st_mtime_ns
    out = make_shapes_coco(shapes, num_train=8, num_val=4, size=128, seed=0)
    assert out['created'] is False and os.stat(ann).st_mtime_ns == before


def test_mmdet_coco_dataset_reads_it(shapes):
    from mmdet.datasets import CocoDataset
    from mmengine.registry import DefaultScope
    # the transforms resolve in the current default scope; other tests may have left 'mmseg'
    with DefaultScope.overwrite_default_scope('mmdet'):
        ds = CocoDataset(data_root=shapes, ann_file='annotations/instances_train.json',
                         data_prefix=dict(img='train/'), metainfo=dict(classes=SHAPE_CLASSES),
                         pipeline=[dict(type='LoadImageFromFile'),
                                   dict(type='LoadAnnotations', with_bbox=True, with_mask=True)])
    assert len(ds) == 8
    sample = ds[0]
    assert sample['img'].shape == (128, 128, 3)
    assert len(sample['gt_masks']) == len(sample['gt_bboxes']) > 0


@pytest.mark.parametrize('breakage,expect', [
    ('missing_root', 'no such dataset folder'),
    ('empty', 'folder is empty'),
    ('no_val_json', 'annotations/instances_val.json is missing'),
    ('bad_json', 'is not readable JSON'),
    ('not_coco', 'is not a COCO instances file'),
    ('no_images', 'lists no images'),
    ('missing_images', 'images listed in the annotations are missing'),
])
def test_broken_datasets_refused_with_fix(tmp_path, breakage, expect):
    root = tmp_path / 'ds'
    if breakage != 'missing_root':
        root.mkdir()
    if breakage not in ('missing_root', 'empty'):
        make_shapes_coco(str(root), num_train=4, num_val=2, size=128)
        ann = root / 'annotations' / 'instances_val.json'
        if breakage == 'no_val_json':
            ann.unlink()
        elif breakage == 'bad_json':
            ann.write_text('{"images": [')
        elif breakage == 'not_coco':
            ann.write_text('{"foo": 1}')
        elif breakage == 'no_images':
            ann.write_text('{"images": [], "annotations": [], "categories": []}')
        elif breakage == 'missing_images':
            (root / 'val' / '000001.png').unlink()
    with pytest.raises(DatasetError, match=expect) as e:
        check_coco_dataset(str(root))
    assert 'make_demo_data.py' in str(e.value)  # says how to fix it


@pytest.mark.parametrize('policy', [None, 'PASSIVE'])
def test_make_demo_leaves_openmps_wait_policy_to_openmp_or_the_user(tmp_path, policy):
    """``make demo``'s commands get OpenMP's own wait policy (a sleeping thread made the demo's
    2-thread step ~20 % slower: docs/training.md#threads-and-openmps-wait-policy), or the one the
    user set. Each command is run by a stand-in interpreter that records its environment."""
    import shutil
    import subprocess
    if shutil.which('make') is None:
        pytest.skip('no make on this machine')
    log = tmp_path / 'seen.txt'
    fake = tmp_path / 'python'
    fake.write_text(f'#!/bin/sh\necho "${{OMP_WAIT_POLICY-unset}} $1" >> "{log}"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ('OMP_WAIT_POLICY', 'VIRTUAL_ENV')}
    if policy:
        env['OMP_WAIT_POLICY'] = policy
    res = subprocess.run(['make', '-s', '-o', 'setup', 'demo', f'PY={fake}',
                          f'DEMO_DIR={tmp_path / "work"}'], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = log.read_text().split('\n')[:-1]
    assert [s.split()[1] for s in seen[:3]] == ['tools/make_demo_data.py', 'tools/train.py',
                                               'tools/test.py'], seen
    assert {s.split()[0] for s in seen} == {policy or 'unset'}, seen
