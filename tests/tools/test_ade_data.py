"""The ADE20k-format demo data: the ADEChallengeData2016 layout and ids, deterministic, read by
mmseg's ADE20KDataset as the recipes read ADE20k, and clear errors for broken folders."""
import os

import cv2
import numpy as np
import pytest

from deepvit_tools.demo_data import ADE_DEMO_CLASSES, DatasetError, check_ade_dataset, make_ade_demo
from deepvit_tools.demo_data.ade import ADE_DEMO_LABELS

SIZE = 128


@pytest.fixture(scope='module')
def ade(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('ade'))
    make_ade_demo(root, num_train=6, num_val=3, size=SIZE, seed=0)
    return root


def _files(root, kind, split):
    return sorted(os.listdir(os.path.join(root, kind, split)))


def test_layout_ids_and_sizes(ade):
    assert check_ade_dataset(ade) == dict(training=dict(images=6), validation=dict(images=3))
    seen = set()
    widths = set()
    for split, n in (('training', 6), ('validation', 3)):
        images, labels = _files(ade, 'images', split), _files(ade, 'annotations', split)
        assert len(images) == len(labels) == n
        assert [f[:-4] for f in images] == [f[:-4] for f in labels]
        for im_name, lb_name in zip(images, labels):
            img = cv2.imread(os.path.join(ade, 'images', split, im_name))
            label = cv2.imread(os.path.join(ade, 'annotations', split, lb_name), cv2.IMREAD_UNCHANGED)
            assert label.dtype == np.uint8 and label.ndim == 2 and img.shape[:2] == label.shape
            assert img.shape[0] == SIZE and SIZE <= img.shape[1] <= SIZE * 11 // 8
            widths.add(img.shape[1])
            seen |= set(np.unique(label).tolist())
            # the sky is above the floor in every column that has both
            sky, floor = label == ADE_DEMO_LABELS['sky'], label == ADE_DEMO_LABELS['floor']
            rows = np.arange(label.shape[0])[:, None]
            both = sky.any(0) & floor.any(0)
            top_floor = np.where(floor, rows, 10**6).min(0)
            bottom_sky = np.where(sky, rows, -1).max(0)
            assert (bottom_sky[both] < top_floor[both]).all()
    assert seen <= {0, *ADE_DEMO_LABELS.values()}
    assert {3, 4} <= seen and len(seen & {42, 115, 120}) >= 2  # stuff and things occur
    assert len(widths) > 1  # not all the same shape


def test_ids_are_ade20k_classes():
    from mmseg.datasets import ADE20KDataset
    names = ADE20KDataset.METAINFO['classes']
    for name, ade_id in ADE_DEMO_LABELS.items():
        assert names[ade_id - 1] == name  # reduce_zero_label: class index = id - 1
    assert ADE_DEMO_CLASSES == tuple(ADE_DEMO_LABELS)


def test_deterministic(tmp_path, ade):
    a, b = str(tmp_path / 'a'), str(tmp_path / 'b')
    make_ade_demo(a, num_train=6, num_val=3, size=SIZE, seed=0)
    make_ade_demo(b, num_train=6, num_val=3, size=SIZE, seed=1)

    def read(root, kind, split, i):
        with open(os.path.join(root, kind, split, _files(root, kind, split)[i]), 'rb') as f:
            return f.read()
    for kind in ('images', 'annotations'):
        assert read(a, kind, 'training', 0) == read(ade, kind, 'training', 0)
        assert read(b, kind, 'training', 0) != read(a, kind, 'training', 0)
    assert read(a, 'annotations', 'validation', 0) != read(a, 'annotations', 'training', 0)


def test_existing_dataset_kept_unless_overwrite(tmp_path):
    root = str(tmp_path / 'ade')
    make_ade_demo(root, num_train=3, num_val=2, size=SIZE)
    path = os.path.join(root, 'annotations', 'training', _files(root, 'annotations', 'training')[0])
    before = os.stat(path).st_mtime_ns
    assert make_ade_demo(root, num_train=3, num_val=2, size=SIZE)['created'] is False
    assert os.stat(path).st_mtime_ns == before
    out = make_ade_demo(root, num_train=2, num_val=1, size=SIZE, overwrite=True)
    assert out['created'] and check_ade_dataset(root)['training']['images'] == 2  # no stale files


@pytest.mark.parametrize('subset', [False, True])
def test_mmseg_ade20k_dataset_reads_it(ade, subset):
    """As the recipes (150 classes) and the demo config (the 5 classes that occur) read it."""
    from mmengine.registry import init_default_scope
    from mmseg.datasets import ADE20KDataset
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmseg')
    kwargs = dict(metainfo=dict(classes=ADE_DEMO_CLASSES)) if subset else {}
    ds = ADE20KDataset(data_root=ade, data_prefix=dict(img_path='images/validation',
                                                       seg_map_path='annotations/validation'),
                       pipeline=[dict(type='LoadImageFromFile'),
                                 dict(type='LoadAnnotations', reduce_zero_label=True)], **kwargs)
    assert len(ds) == 3
    sample = ds[0]
    raw = cv2.imread(sample['seg_map_path'], cv2.IMREAD_UNCHANGED)
    gt = sample['gt_seg_map']
    assert gt.shape == raw.shape == sample['img'].shape[:2]
    assert (gt[raw == 0] == 255).all()  # unlabelled -> ignored
    for name, ade_id in ADE_DEMO_LABELS.items():
        want = ADE_DEMO_CLASSES.index(name) if subset else ade_id - 1
        assert (gt[raw == ade_id] == want).all()


def _break(root, breakage):
    split = os.path.join(root, 'annotations', 'validation')
    first = os.path.join(split, sorted(os.listdir(split))[0])
    if breakage == 'no_annotations_dir':
        for f in os.listdir(split):
            os.remove(os.path.join(split, f))
        os.rmdir(split)
    elif breakage == 'no_images':
        img_dir = os.path.join(root, 'images', 'validation')
        for f in os.listdir(img_dir):
            os.remove(os.path.join(img_dir, f))
    elif breakage == 'unpaired':
        os.remove(first)
    elif breakage == 'rgb_label':
        cv2.imwrite(first, np.zeros((8, 8, 3), np.uint8))
    elif breakage == 'bad_id':
        cv2.imwrite(first, np.full((8, 8), 200, np.uint8))
    elif breakage == 'not_png':
        with open(first, 'w') as f:
            f.write('not an image')


@pytest.mark.parametrize('breakage,expect', [
    ('missing_root', 'no such dataset folder'),
    ('empty', 'folder is empty'),
    ('no_annotations_dir', r'annotations/validation/ is missing'),
    ('no_images', 'no .jpg images'),
    ('unpaired', 'images without a label map'),
    ('rgb_label', 'single-channel 8-bit'),
    ('bad_id', 'label 200 is not an ADE20k id'),
    ('not_png', 'not a readable PNG'),
])
def test_broken_datasets_refused_with_fix(tmp_path, breakage, expect):
    root = tmp_path / 'ade'
    if breakage != 'missing_root':
        root.mkdir()
    if breakage not in ('missing_root', 'empty'):
        make_ade_demo(str(root), num_train=2, num_val=2, size=SIZE)
        _break(str(root), breakage)
    with pytest.raises(DatasetError, match=expect) as e:
        check_ade_dataset(str(root))
    assert 'make_ade_demo_data.py' in str(e.value)  # says how to fix it


def test_bad_arguments():
    with pytest.raises(ValueError, match='at least 128'):
        make_ade_demo('/nonexistent', size=64)
    with pytest.raises(ValueError, match='both splits'):
        make_ade_demo('/nonexistent', num_val=0)
