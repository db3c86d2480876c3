from .ade import ADE_DEMO_CLASSES, ADE_DEMO_LABELS, check_ade_dataset, make_ade_demo
from .shapes import SHAPE_CLASSES, DatasetError, check_coco_dataset, make_shapes_coco

__all__ = ['SHAPE_CLASSES', 'DatasetError', 'check_coco_dataset', 'make_shapes_coco',
           'ADE_DEMO_CLASSES', 'ADE_DEMO_LABELS', 'check_ade_dataset', 'make_ade_demo']
