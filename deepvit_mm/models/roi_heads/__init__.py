"""mmdet RoI-head parts (needs mmdet): ``roi_extractors``."""
from .roi_extractors import CPUSingleRoIExtractor

__all__ = ['CPUSingleRoIExtractor']
