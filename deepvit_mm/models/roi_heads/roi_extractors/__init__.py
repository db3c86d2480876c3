from .cpu_single_level_roi_extractor import CPUSingleRoIExtractor

__all__ = ['CPUSingleRoIExtractor']
