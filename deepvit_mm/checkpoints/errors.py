"""The one error every loading path raises for a checkpoint it cannot or must not load."""

__all__ = ['CheckpointError']


class CheckpointError(RuntimeError):
    """A checkpoint that cannot or must not be loaded; the message says why and what to do."""


#: what to do with a sharded checkpoint (mmengine's FSDPStrategy with ``state_dict_cfg='local'``:
#: a folder of ``rank<i>.pth``, one part per process), which no tool reads as a model's weights
SHARDED_HINT = ("FSDPStrategy with state_dict_cfg='local' writes one part of the weights per "
                "process, and tools/test.py, load_from and the inferencers read whole checkpoints: "
                "train with configs/_base_/fsdp.py, which writes them whole (state_dict_cfg='full', "
                "gathered on rank 0).")
