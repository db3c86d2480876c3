"""The segmentation demo data: a small ADE20k-format dataset of synthetic scenes.

The layout is ``ADEChallengeData2016``'s, which mmseg's ``ADE20KDataset`` reads::

    root/images/{training,validation}/<name>.jpg
    root/annotations/{training,validation}/<name>.png   single-channel uint8 labels

Labels use ADE20k's ids: 0 is "other" (unlabelled; with ``reduce_zero_label=True`` mmseg turns it
into 255 and ignores it) and 1..150 are ADE20k's classes, of which the scenes use five: a ``sky``
(3) region above a wavy horizon, painted with the shapes generator's smooth gradient, a ``floor``
(4) region below it, tiled with a rotated checkerboard, and 2 to 5 things drawn with the shapes
generator (``deepvit_tools.demo_data.shapes``): circle -> ``ball`` (120), square -> ``box`` (42),
triangle -> ``tent`` (115), drawn with probabilities that give each about the same area (a
triangle covers 0.41 of the circle its size gives). Like real classes, things have a typical
colour besides their shape
(balls red to orange, boxes blue, tents green: a hue band per class, random saturation and
brightness), picked to stand out from what they cover. 0 to 2 thin strokes of clutter, of any
colour, are left unlabelled (0), as ADE20k leaves objects outside its 150 classes.

Images are ``size`` pixels high and ``size`` to ``11/8 * size`` wide (non-square and mostly not a
multiple of 32, as ADE20k's are not). Deterministic for a seed; no torch import here.
"""
import os
import os.path as osp
import time
from typing import Dict, Sequence, Tuple

import cv2
import numpy as np

from .shapes import MIN_CONTRAST, SHAPE_CLASSES, DatasetError, background, shape_mask

__all__ = ['ADE_DEMO_CLASSES', 'make_ade_demo', 'check_ade_dataset']

# ADE20k ids (1-based, as in the label PNGs) of the classes the scenes use. mmseg's 0-based class
# index is the id - 1 (reduce_zero_label); ADE20KDataset.METAINFO['classes'][id - 1] is the name.
ADE_DEMO_LABELS: Dict[str, int] = {'sky': 3, 'floor': 4, 'box': 42, 'tent': 115, 'ball': 120}
ADE_DEMO_CLASSES: Tuple[str, ...] = tuple(ADE_DEMO_LABELS)
_THING_OF_SHAPE = {'circle': 'ball', 'square': 'box', 'triangle': 'tent'}
_HUE_BAND = {'ball': (0, 30), 'box': (200, 240), 'tent': (90, 140)}  # degrees
# a shape of size s fills pi/4 s^2 (circle), s^2/2 (square), 3 sqrt(3)/16 s^2 (triangle)
_AREA = np.array([{'circle': np.pi / 4, 'square': 0.5, 'triangle': 3 * np.sqrt(3) / 16}[c]
                  for c in SHAPE_CLASSES])
_SHAPE_P = (1 / _AREA) / (1 / _AREA).sum()
SPLITS = ('training', 'validation')
_REGEN = 'python tools/make_ade_demo_data.py {root} --overwrite'


def _floor(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A rotated checkerboard of two random colours with noise."""
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    tile, angle = rng.uniform(8, 24), rng.uniform(0, np.pi / 2)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    u = (np.cos(angle) * xx + np.sin(angle) * yy) // tile
    v = (-np.sin(angle) * xx + np.cos(angle) * yy) // tile
    board = ((u + v) % 2)[..., None]
    return c0 * (1 - board) + c1 * board + rng.normal(0, 8, (h, w, 3))


def _horizon(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Boolean ``(h, w)`` mask of the sky: above a random wavy line."""
    base = rng.uniform(0.3, 0.6) * h
    amp, period, phase = rng.uniform(0, 0.08 * h), rng.uniform(0.5, 2.0) * w, rng.uniform(0, 2 * np.pi)
    line = base + amp * np.sin(2 * np.pi * np.arange(w) / period + phase)
    return np.arange(h)[:, None] < line[None, :]


def _thing_colour(rng: np.random.Generator, thing: str, under: np.ndarray) -> np.ndarray:
    """An RGB colour in the thing's hue band, at least ``MIN_CONTRAST`` from ``under``."""
    colour = under
    for _ in range(50):
        hsv = np.array([[[rng.uniform(*_HUE_BAND[thing]) / 2, rng.uniform(128, 255),
                          rng.uniform(110, 255)]]], np.float32)  # OpenCV: hue in [0, 180)
        colour = cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB)[0, 0].astype(np.float64)
        if np.linalg.norm(colour - under) >= MIN_CONTRAST:
            break
    return colour


def _thing_mask(rng: np.random.Generator, cls: int, h: int, w: int) -> np.ndarray:
    """A shape from the shapes generator, placed so that most of it lies inside ``h x w``."""
    mask = None
    for _ in range(10):
        full = shape_mask(rng, cls, max(h, w))
        mask = full[:h, :w]
        if mask.sum() >= 0.6 * full.sum():
            break
    return mask


def _make_scene(rng: np.random.Generator, h: int, w: int) -> Tuple[np.ndarray, np.ndarray]:
    """One ``(h, w, 3)`` uint8 RGB image and its ``(h, w)`` uint8 ADE20k label map."""
    sky = _horizon(rng, h, w)
    img = np.where(sky[..., None], background(rng, max(h, w))[:h, :w], _floor(rng, h, w))
    label = np.where(sky, ADE_DEMO_LABELS['sky'], ADE_DEMO_LABELS['floor']).astype(np.uint8)
    for _ in range(int(rng.integers(2, 6))):
        cls = int(rng.choice(len(SHAPE_CLASSES), p=_SHAPE_P))
        mask = _thing_mask(rng, cls, h, w) > 0
        if not mask.any():
            continue
        thing = _THING_OF_SHAPE[SHAPE_CLASSES[cls]]
        img[mask] = _thing_colour(rng, thing, img[mask].mean(0)) \
            + rng.normal(0, 6, (int(mask.sum()), 3))
        label[mask] = ADE_DEMO_LABELS[thing]
    for _ in range(int(rng.integers(0, 3))):  # unlabelled clutter
        stroke = np.zeros((h, w), np.uint8)
        p0 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        p1 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        cv2.line(stroke, p0, p1, 1, int(rng.integers(2, 6)))
        img[stroke > 0] = rng.uniform(0, 255, 3)
        label[stroke > 0] = 0
    return np.clip(img, 0, 255).astype(np.uint8), label


def _write_split(root: str, split: str, num: int, size: int, seed: int) -> Dict[str, int]:
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    img_dir, ann_dir = osp.join(root, 'images', split), osp.join(root, 'annotations', split)
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    pixels = np.zeros(256, np.int64)
    for i in range(num):
        w = int(rng.integers(size, size * 11 // 8 + 1))
        img, label = _make_scene(rng, size, w)
        name = f'ADE_demo_{split[:5]}_{i:06d}'
        cv2.imwrite(osp.join(img_dir, name + '.jpg'), img[..., ::-1],  # RGB -> BGR for cv2
                    [cv2.IMWRITE_JPEG_QUALITY, 92])
        cv2.imwrite(osp.join(ann_dir, name + '.png'), label)
        pixels += np.bincount(label.ravel(), minlength=256)
    return dict(images=num, **{f'{c}_pixels': int(pixels[i]) for c, i in ADE_DEMO_LABELS.items()},
                unlabelled_pixels=int(pixels[0]))


def make_ade_demo(root: str, num_train: int = 300, num_val: int = 60, size: int = 256,
                  seed: int = 0, overwrite: bool = False) -> dict:
    """Write the demo dataset under ``root`` in the ``ADEChallengeData2016`` layout.

    Args:
        root (str): Output folder (it gets ``images/`` and ``annotations/``).
        num_train (int): Training images. Default: 300.
        num_val (int): Held-out validation images. Default: 60.
        size (int): Image height in pixels; widths are ``size`` to ``11/8 * size``. Default: 256.
        seed (int): Random seed; training and validation use different streams. Default: 0.
        overwrite (bool): Rewrite an existing valid dataset. Default: False.

    Returns:
        dict: ``{'root', 'classes', 'created', 'training': {...}, 'validation': {...}}`` with the
        image count (and, when created, pixel counts per class) of each split.
    """
    if size < 128:
        raise ValueError(f'size={size}: the shapes are 24-96 px, use images of at least 128 px')
    if num_train < 1 or num_val < 1:
        raise ValueError(f'num_train={num_train}, num_val={num_val}: both splits need an image')
    if not overwrite and osp.isdir(root):
        try:
            counts = check_ade_dataset(root)
            return dict(root=root, classes=ADE_DEMO_CLASSES, created=False, **counts)
        except DatasetError:
            pass  # incomplete or broken: write it anew
    t0 = time.time()
    out = dict(root=root, classes=ADE_DEMO_CLASSES, created=True)
    for split, num in zip(SPLITS, (num_train, num_val)):
        for sub in ('images', 'annotations'):  # no stale files from an earlier, larger run
            d = osp.join(root, sub, split)
            if osp.isdir(d):
                for f in os.listdir(d):
                    os.remove(osp.join(d, f))
        out[split] = _write_split(root, split, num, size, seed)
    out['seconds'] = round(time.time() - t0, 1)
    return out


def check_ade_dataset(root: str, splits: Sequence[str] = SPLITS, check_labels: int = 16) -> dict:
    """Check an ``ADEChallengeData2016``-layout folder before training or testing on it.

    Every ``images/<split>/*.jpg`` must have its ``annotations/<split>/*.png`` and the other way
    round; the first ``check_labels`` label maps of each split are read and must be single-channel
    8-bit with ADE20k ids (0..150).

    Args:
        root (str): The dataset folder (the one holding ``images/`` and ``annotations/``).
        splits (Sequence[str]): Splits to check. Default: ``('training', 'validation')``.
        check_labels (int): Label maps read per split. Default: 16.

    Returns:
        dict: ``{split: {'images': n}}``.

    Raises:
        DatasetError: Naming the problem and how to fix it.
    """
    fix = _REGEN.format(root=root)
    if not osp.isdir(root):
        raise DatasetError(f'{root}: no such dataset folder; create the demo data with `{fix}` '
                           f'(or point data_root at ADEChallengeData2016)')
    if not os.listdir(root):
        raise DatasetError(f'{root}: the folder is empty; create the demo data with `{fix}`')
    out = {}
    for split in splits:
        img_dir, ann_dir = osp.join(root, 'images', split), osp.join(root, 'annotations', split)
        for d in (img_dir, ann_dir):
            if not osp.isdir(d):
                raise DatasetError(f'{root}: {osp.relpath(d, root)}/ is missing (expected the '
                                   f'ADEChallengeData2016 layout images/{{training,validation}}, '
                                   f'annotations/{{training,validation}}); regenerate with `{fix}`')
        images = sorted(f[:-4] for f in os.listdir(img_dir) if f.endswith('.jpg'))
        labels = sorted(f[:-4] for f in os.listdir(ann_dir) if f.endswith('.png'))
        if not images:
            raise DatasetError(f'{img_dir}: no .jpg images; regenerate with `{fix}`')
        no_label = sorted(set(images) - set(labels))
        no_image = sorted(set(labels) - set(images))
        if no_label or no_image:
            example = (f'{no_label[0]}.jpg has no annotation' if no_label
                       else f'{no_image[0]}.png has no image')
            raise DatasetError(f'{root}/{split}: {len(no_label)} images without a label map and '
                               f'{len(no_image)} label maps without an image (e.g. {example}); '
                               f'regenerate with `{fix}`')
        for name in labels[:check_labels]:
            path = osp.join(ann_dir, name + '.png')
            label = cv2.imread(path, cv2.IMREAD_UNCHANGED)
            if label is None:
                raise DatasetError(f'{path} is not a readable PNG; regenerate with `{fix}`')
            if label.ndim != 2 or label.dtype != np.uint8:
                raise DatasetError(f'{path}: label maps must be single-channel 8-bit PNGs of '
                                   f'ADE20k ids, got shape {label.shape} of {label.dtype}; '
                                   f'regenerate with `{fix}`')
            if int(label.max()) > 150:
                raise DatasetError(f'{path}: label {int(label.max())} is not an ADE20k id '
                                   f'(0 = unlabelled, 1..150 = classes); regenerate with `{fix}`')
        out[split] = dict(images=len(images))
    return out
