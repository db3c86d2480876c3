"""What deepvit_mm adds to mmengine's training runtime (registered on import)."""
from .hooks import CrashSafeCheckpointHook, FiniteLossHook, RNGStateHook

__all__ = ['CrashSafeCheckpointHook', 'FiniteLossHook', 'RNGStateHook']
