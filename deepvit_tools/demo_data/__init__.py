from .ade import ADE_DEMO_CLASSES, check_ade_dataset, make_ade_demo
from .shapes import DatasetError, make_shapes_coco

__all__ = ['DatasetError', 'make_shapes_coco', 'ADE_DEMO_CLASSES', 'check_ade_dataset',
           'make_ade_demo']
