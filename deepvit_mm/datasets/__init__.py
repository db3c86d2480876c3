from .shapes import SHAPE_CLASSES, DatasetError, check_coco_dataset, make_shapes_coco

__all__ = ['SHAPE_CLASSES', 'DatasetError', 'check_coco_dataset', 'make_shapes_coco']
