"""Synthetic inputs: images for a backbone; a dataloader's detection or segmentation batch
(mmdet's ``demo_mm_inputs``, or a random label map), raw or through the model's preprocessor."""
from typing import Dict, Tuple

import torch
import torch.nn as nn

from deepvit_mm.deploy.export import example_input

from .models import num_classes_of

__all__ = []


def backbone_input(size: Tuple[int, int], batch: int = 1, device: str = 'cpu',
                   seed: int = 0) -> torch.Tensor:
    """``deepvit_mm.deploy.example_input``: a seeded ``(batch, 3, H, W)`` float32 batch."""
    return example_input(size, seed, batch).to(device)


def synthetic_data(task: str, size: Tuple[int, int], batch: int = 1, num_classes: int = 80,
                   num_objects: int = 5, seed: int = 0) -> Dict[str, list]:
    """A dataloader's batch of random uint8 images and targets, exactly ``size`` (H, W).

    Args:
        task (str): ``'det'`` (boxes, labels and masks) or ``'seg'`` (a label map).
        size (tuple[int, int]): Image ``(H, W)``.
        batch (int): Images. Default: 1.
        num_classes (int): Classes of the random labels. Default: 80.
        num_objects (int): Instances per image (``'det'``). Default: 5.
        seed (int): Seed of the images and targets. Default: 0.

    Returns:
        dict: ``inputs`` (list of ``(3, H, W)`` uint8 tensors) and ``data_samples``.
    """
    h, w = size
    torch.manual_seed(seed)
    if task == 'det':
        from mmdet.testing import demo_mm_inputs
        return demo_mm_inputs(batch_size=batch, image_shapes=[(3, h, w)] * batch,
                              num_items=[num_objects] * batch, num_classes=num_classes,
                              with_mask=True)
    if task != 'seg':
        raise ValueError(f"task {task!r}: use 'det' or 'seg'")
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8))
        s = SegDataSample(gt_sem_seg=PixelData(data=torch.randint(0, num_classes, (1, h, w))))
        s.set_metainfo(dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w)))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def synthetic_batch(model: nn.Module, task: str, size: Tuple[int, int], batch: int = 1,
                    num_objects: int = 5, seed: int = 0) -> Tuple[torch.Tensor, list]:
    """``synthetic_data`` through ``model.data_preprocessor`` in test mode (a segmentor's training
    mode would pad to its crop size; the size asked for is the size measured): the ``(inputs,
    data_samples)`` of ``model(inputs, data_samples, mode=...)``, targets kept for ``'loss'``."""
    data = synthetic_data(task, size, batch, num_classes_of(model, task), num_objects, seed)
    out = model.data_preprocessor(data, False)
    return out['inputs'], out['data_samples']
