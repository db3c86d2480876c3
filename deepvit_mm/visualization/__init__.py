"""Pictures of what a model computes: its maps laid over the image they were computed from, and
its training curves."""
from .align import align_to_image, valid_grid
from .attention import (
    AttentionDrawer,
    AttentionError,
    AttentionMap,
    attention_maps,
    attention_probs,
    attention_sites,
    build_classifier,
    top_mass_mask,
    visualize_attention,
)
from .curves import Scalars, find_scalars, plot_curves, read_scalars
from .featmaps import (
    CHANNEL_REDUCTIONS,
    FeatmapExtractor,
    FeatmapLevel,
    LayerFeatmaps,
    VisualizationError,
    visualize_featmaps,
)

__all__ = ['align_to_image', 'valid_grid', 'CHANNEL_REDUCTIONS', 'FeatmapExtractor',
           'FeatmapLevel', 'LayerFeatmaps', 'VisualizationError', 'visualize_featmaps',
           'Scalars', 'find_scalars', 'read_scalars', 'plot_curves', 'AttentionDrawer',
           'AttentionError', 'AttentionMap', 'attention_maps', 'attention_probs',
           'attention_sites', 'build_classifier', 'top_mass_mask', 'visualize_attention']
