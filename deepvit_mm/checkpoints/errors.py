"""The one error every loading path raises for a checkpoint it cannot or must not load."""

__all__ = ['CheckpointError']


class CheckpointError(RuntimeError):
    """A checkpoint that cannot or must not be loaded; the message says why and what to do."""
