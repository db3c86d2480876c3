"""The embedded demo data: a small COCO-format instance-segmentation dataset of synthetic shapes.

Images are RGB, ``size x size``, a smooth random background with noise and 1 to 4 objects
(circle, square, triangle; squares and triangles rotated) of random size and of a random colour
that stands out from what it covers. Later
objects may occlude earlier ones: each annotation is the object's visible mask (bbox, area and
polygons derived from it); objects left with under 40 % of their area visible are dropped.
Deterministic for a seed. No torch import here.
"""
import json
import os
import os.path as osp
import time
from typing import Dict, Sequence, Tuple

import cv2
import numpy as np

__all__ = ['DatasetError', 'make_shapes_coco']

SHAPE_CLASSES: Tuple[str, ...] = ('circle', 'square', 'triangle')
_REGEN = 'python tools/make_demo_data.py {root} --overwrite'


class DatasetError(ValueError):
    """A dataset directory that cannot be used; the message says what is wrong and the fix."""


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    t = (np.cos(angle) * xx + np.sin(angle) * yy)
    t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    return img + rng.normal(0, 8, (size, size, 3))


def shape_mask(rng: np.random.Generator, cls: int, size: int) -> np.ndarray:
    s = rng.uniform(24, 96)
    r = s / 2
    cx, cy = rng.uniform(r + 1, size - r - 1, 2)
    mask = np.zeros((size, size), np.uint8)
    if SHAPE_CLASSES[cls] == 'circle':
        cv2.circle(mask, (round(cx), round(cy)), round(r), 1, -1)
    else:
        n = 4 if SHAPE_CLASSES[cls] == 'square' else 3
        a = rng.uniform(0, 2 * np.pi)
        pts = [(cx + r * np.cos(a + 2 * np.pi * j / n), cy + r * np.sin(a + 2 * np.pi * j / n))
               for j in range(n)]
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
    return mask


def _contrasting_colour(rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """A colour at least ``MIN_CONTRAST`` (RGB distance) from what it is painted over."""
    colour = rng.uniform(0, 255, 3)
    for _ in range(50):
        if np.linalg.norm(colour - under) >= MIN_CONTRAST:
            break
        colour = rng.uniform(0, 255, 3)
    return colour


MIN_CONTRAST = 90.0


def _make_image(rng: np.random.Generator, size: int):
    img = background(rng, size)
    objs = []  # (class, full mask, visible mask)
    for _ in range(int(rng.integers(1, 5))):
        cls = int(rng.integers(0, len(SHAPE_CLASSES)))
        mask = shape_mask(rng, cls, size)
        colour = _contrasting_colour(rng, img[mask > 0].mean(0))
        img[mask > 0] = colour + rng.normal(0, 6, (int(mask.sum()), 3))
        for _, _, vis in objs:
            vis[mask > 0] = 0
        objs.append((cls, mask, mask.copy()))
    kept = [(c, v) for c, m, v in objs if v.sum() >= 0.4 * m.sum()]
    return np.clip(img, 0, 255).astype(np.uint8), kept


def _annotations(cls: int, vis: np.ndarray, image_id: int, ann_id: int):
    contours, _ = cv2.findContours(vis, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    polys = [c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3]
    if not polys:
        return None
    x, y, w, h = cv2.boundingRect(vis)
    return dict(id=ann_id, image_id=image_id, category_id=cls + 1, bbox=[x, y, w, h],
                area=int(vis.sum()), iscrowd=0, segmentation=polys)


def _write_split(root: str, split: str, num: int, size: int, seed: int) -> Dict[str, int]:
    rng = np.random.default_rng([seed, 0 if split == 'train' else 1])
    os.makedirs(osp.join(root, split), exist_ok=True)
    images, anns = [], []
    for i in range(num):
        img, objs = _make_image(rng, size)
        name = f'{i:06d}.png'
        cv2.imwrite(osp.join(root, split, name), img[..., ::-1])  # RGB -> BGR for cv2
        images.append(dict(id=i + 1, file_name=name, width=size, height=size))
        for cls, vis in objs:
            ann = _annotations(cls, vis, i + 1, len(anns) + 1)
            if ann is not None:
                anns.append(ann)
    coco = dict(images=images, annotations=anns,
                categories=[dict(id=i + 1, name=n) for i, n in enumerate(SHAPE_CLASSES)])
    with open(osp.join(root, 'annotations', f'instances_{split}.json'), 'w') as f:
        json.dump(coco, f)
    return dict(images=len(images), objects=len(anns))


def make_shapes_coco(root: str, num_train: int = 400, num_val: int = 60, size: int = 256,
                     seed: int = 0, overwrite: bool = False) -> dict:
    """Write the demo dataset under ``root`` (``train/``, ``val/``, ``annotations/``).

    Args:
        root (str): Output folder.
        num_train (int): Training images. Default: 400.
        num_val (int): Held-out validation images. Default: 60.
        size (int): Image side in pixels. Default: 256.
        seed (int): Random seed; train and val use different streams. Default: 0.
        overwrite (bool): Rewrite an existing valid dataset. Default: False.

    Returns:
        dict: ``{'root', 'classes', 'train': {'images', 'objects'}, 'val': {...}, 'created'}``.
    """
    if size < 128:
        raise ValueError(f'size={size}: shapes are 24-96 px, use images of at least 128 px')
    if not overwrite and osp.isdir(root):
        try:
            counts = check_coco_dataset(root)
            return dict(root=root, classes=SHAPE_CLASSES, created=False, **counts)
        except DatasetError:
            pass  # incomplete or broken: write it anew
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    t0 = time.time()
    out = dict(root=root, classes=SHAPE_CLASSES, created=True)
    for split, num in (('train', num_train), ('val', num_val)):
        out[split] = _write_split(root, split, num, size, seed)
    out['seconds'] = round(time.time() - t0, 1)
    return out


def check_coco_dataset(root: str, splits: Sequence[str] = ('train', 'val')) -> dict:
    """Check a COCO-format folder (``<split>/`` images, ``annotations/instances_<split>.json``).

    Returns:
        dict: ``{split: {'images', 'objects'}}``.

    Raises:
        DatasetError: Naming the problem and how to fix it.
    """
    fix = _REGEN.format(root=root)
    if not osp.isdir(root):
        raise DatasetError(f'{root}: no such dataset folder; create it with `{fix}`')
    if not os.listdir(root):
        raise DatasetError(f'{root}: the folder is empty; create the dataset with `{fix}`')
    out = {}
    for split in splits:
        ann = osp.join(root, 'annotations', f'instances_{split}.json')
        if not osp.isfile(ann):
            raise DatasetError(f'{root}: annotations/instances_{split}.json is missing; '
                               f'regenerate with `{fix}`')
        try:
            with open(ann) as f:
                coco = json.load(f)
        except (OSError, ValueError) as e:
            raise DatasetError(f'{ann} is not readable JSON ({e}); regenerate with `{fix}`') \
                from None
        if not isinstance(coco, dict) or not {'images', 'annotations', 'categories'} <= set(coco):
            raise DatasetError(f'{ann} is not a COCO instances file (needs images, annotations '
                               f'and categories); regenerate with `{fix}`')
        if not coco['images']:
            raise DatasetError(f'{ann} lists no images; regenerate with `{fix}`')
        missing = [im['file_name'] for im in coco['images']
                   if not osp.isfile(osp.join(root, split, im['file_name']))]
        if missing:
            raise DatasetError(f'{root}/{split}: {len(missing)} of {len(coco["images"])} images '
                               f'listed in the annotations are missing (e.g. {missing[0]}); '
                               f'regenerate with `{fix}`')
        out[split] = dict(images=len(coco['images']), objects=len(coco['annotations']))
    return out
