"""Pictures of what a model computes: its maps laid over the image they were computed from, and
its training curves."""
from .align import align_to_image
from .attention import (
    AttentionDrawer,
    attention_maps,
    attention_probs,
    attention_sites,
    visualize_attention,
)
from .curves import find_scalars, plot_curves, read_scalars
from .drawing import VisualizationError
from .featmaps import FeatmapExtractor, visualize_featmaps

__all__ = ['align_to_image', 'VisualizationError', 'FeatmapExtractor', 'visualize_featmaps',
           'find_scalars', 'read_scalars', 'plot_curves', 'AttentionDrawer', 'attention_maps',
           'attention_probs', 'attention_sites', 'visualize_attention']
