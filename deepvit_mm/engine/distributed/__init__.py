"""Distributed runs: on CPU processes with gloo, mmengine's DDP wrapper without device ids
(``ddp``); sharded training through mmengine's FSDP strategy (``fsdp``)."""
from .ddp import CPUDistributedDataParallel, setup_cpu_distributed
from .fsdp import CPUFullyShardedDataParallel, GlobalNormFSDPStrategy, columnar_block_policy

__all__ = ['CPUDistributedDataParallel', 'setup_cpu_distributed', 'CPUFullyShardedDataParallel',
           'GlobalNormFSDPStrategy', 'columnar_block_policy']
