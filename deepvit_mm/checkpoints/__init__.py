"""Every way weights enter a model: fetching, safe and verified reading, one matcher, one report.

One module per job, each depending only on those above it:

=====================  ============================================================================
``errors``             ``CheckpointError``, raised by every path for a file it will not load
``trust``              files the user trusts explicitly (``DEEPVIT_MM_TRUSTED_CHECKPOINTS``)
``integrity``          zip CRC-32 and safetensors structure checks, SHA-256
``fetch``              local paths, ``http(s)://`` URLs (verified, cached), ``hf-hub:`` names
``stored_config``      config text mmengine stores in checkpoints and would evaluate
``unpickling``         ``torch.load`` admitting an allowlist only; what a failed load met
``reading``            ``read_checkpoint``: verified, then unpickled with an allowlist only
``matching``           ``plan_load`` (what goes where, the report, the refusals) and ``load_weights``
                       (the plan applied in one step): every loading path, one report
``mmengine_hooks``     mmengine's reader and ``load_state_dict`` routed here; ``--resume`` lookup
=====================  ============================================================================

Nothing here imports the backbones: a module that takes its weights through the matcher implements
``matching.WeightsTarget`` (every deepvit_mm backbone does). What is and is not verified for each
format, and the costs, are in docs/weights.md.
"""
from .errors import CheckpointError
from .fetch import resolve_checkpoint
from .matching import (
           LoadReport,
           WeightsTarget,
           extract_state_dict,
           load_weights,
           plan_load,
           require_complete_model,
)
from .mmengine_hooks import find_resumable_checkpoint, install_mmengine_loader
from .reading import read_checkpoint, safe_globals
from .trust import trusted_checkpoints

__all__ = ['CheckpointError', 'LoadReport', 'WeightsTarget', 'safe_globals', 'trusted_checkpoints',
           'resolve_checkpoint', 'read_checkpoint', 'extract_state_dict', 'plan_load',
           'load_weights', 'install_mmengine_loader', 'find_resumable_checkpoint',
           'require_complete_model']
