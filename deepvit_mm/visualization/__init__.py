"""Pictures of what a model computes: its maps laid over the image they were computed from."""
from .align import align_to_image, valid_grid
from .featmaps import (
    CHANNEL_REDUCTIONS,
    FeatmapExtractor,
    FeatmapLevel,
    LayerFeatmaps,
    VisualizationError,
    visualize_featmaps,
)

__all__ = ['align_to_image', 'valid_grid', 'CHANNEL_REDUCTIONS', 'FeatmapExtractor',
           'FeatmapLevel', 'LayerFeatmaps', 'VisualizationError', 'visualize_featmaps']
