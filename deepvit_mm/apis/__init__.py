"""What the tools, the demo and the inferencers call: reading a config, building its model and
applying the tools' flags to it (``config``); what they do around the run (``runs``); the model
zoo by name and mmdet's or mmseg's inferencer (``inference``)."""
from .config import (
    VIS_BACKENDS,
    build_from_config,
    enable_tta,
    enable_visualization,
    load_config,
    num_classes_of,
    prepare_config,
    read_config,
    set_test_out,
    set_vis_backends,
    task_of,
    task_registry,
    vis_backend_types,
)
from .inference import (
    PALETTES,
    build_inferencer,
    default_device,
    resolve_model,
    run_inferencer,
)
from .runs import objects_frozen

__all__ = ['prepare_config', 'task_of', 'task_registry', 'read_config', 'load_config',
           'build_from_config', 'num_classes_of', 'enable_visualization', 'VIS_BACKENDS',
           'vis_backend_types', 'set_vis_backends', 'enable_tta', 'set_test_out', 'resolve_model',
           'PALETTES', 'default_device', 'build_inferencer', 'run_inferencer', 'objects_frozen']
