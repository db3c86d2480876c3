"""RoI extractors for mmdet's RoI heads: ``CPUSingleRoIExtractor`` (RoIAlign faster on CPU)."""
from .cpu_single_level_roi_extractor import CPUSingleRoIExtractor

__all__ = ['CPUSingleRoIExtractor']
