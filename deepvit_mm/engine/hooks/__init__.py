"""Runner hooks, one a file, each registered in mmengine's ``HOOKS`` under its class name (nothing
of mmengine's own hooks changes); the recipes use the first four (``configs/_base_``)."""
from .check_consumers_hook import CheckConsumersHook
from .crash_safe_checkpoint_hook import CheckpointWriteError, CrashSafeCheckpointHook
from .fastest_step_hook import FastestStepHook
from .finite_loss_hook import FiniteLossHook
from .rng_state_hook import RNGStateHook

__all__ = ['CheckConsumersHook', 'CrashSafeCheckpointHook', 'CheckpointWriteError',
           'FiniteLossHook', 'RNGStateHook', 'FastestStepHook']
