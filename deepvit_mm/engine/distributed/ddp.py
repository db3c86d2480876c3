"""Distributed training on CPU processes (gloo) through mmengine's Runner.

mmengine 0.10.7 starts distributed runs for GPUs only: its ``init_dist`` calls
``torch.cuda.set_device`` before ``init_process_group`` and its ``Runner.wrap_model`` hands
``device_ids=[LOCAL_RANK]`` to ``DistributedDataParallel``, which DDP refuses for a CPU module; the
recipes' ``env_cfg.dist_cfg`` asks for NCCL. On a machine without CUDA, ``setup_cpu_distributed``
(called by ``tools/train.py`` and ``tools/test.py``) starts the process group itself with gloo
(mmengine then skips its own start) and selects ``CPUDistributedDataParallel``, mmengine's DDP
wrapper without device ids. GPU runs are left entirely to mmengine.

Slurm: mmengine's ``slurm`` launcher picks a GPU by ``SLURM_PROCID % torch.cuda.device_count()``,
which fails without one; on CPU ``setup_cpu_distributed`` reads the same variables it reads
(``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_NODELIST`` through ``scontrol show hostname``;
``MASTER_ADDR`` and ``MASTER_PORT`` where set, else the first node and 29500) and sets the same
environment it sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` from ``SLURM_LOCALID``,
``MASTER_ADDR``, ``MASTER_PORT``) before starting the gloo group.

SyncBN: in a distributed GPU run mmengine keeps the ``SyncBN`` layers a config builds (it reverts
them to BN only in single-process runs). PyTorch's SyncBatchNorm has no CPU implementation, so on
CPU ``CPUDistributedDataParallel`` reverts them to BN, as a single-process run does, and says so:
each process then normalises with the statistics of its own batch.
"""
import datetime
import os
import shutil
import subprocess
from typing import Optional

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.model import MMDistributedDataParallel, revert_sync_batchnorm
from mmengine.registry import MODEL_WRAPPERS

from ...compat.torch import TORCH_VERSION
from ...version import FEATURE_FLOORS, release

__all__ = ['CPUDistributedDataParallel', 'setup_cpu_distributed']


def cpu_fsdp_problem() -> Optional[str]:
    """None if FullyShardedDataParallel runs on CPU processes with this torch
    (``FEATURE_FLOORS['sharded training on CPU']``), else why not and what to do instead."""
    _, lowest, known = FEATURE_FLOORS['sharded training on CPU']
    if TORCH_VERSION >= release(lowest).release:
        return None
    return (f'sharded training (FSDPStrategy) on CPU is tested with torch {lowest}; '
            f'{known}. Train with DDP there (tools/dist_train.sh without the FSDP config), or '
            f'with torch >= {lowest}; on GPUs FSDP is mmengine\'s own.')


@MODEL_WRAPPERS.register_module()
class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` for a model on CPU (gloo).

    Args:
        module (nn.Module): The model, on CPU.
        device_ids (list[int], optional): Ignored: mmengine's Runner passes ``[LOCAL_RANK]``, a
            GPU index, which DDP refuses for a CPU module.
        kwargs: ``DistributedDataParallel`` arguments.
    """

    def __init__(self, module: torch.nn.Module, device_ids=None, **kwargs) -> None:
        super().__init__(module=without_sync_batchnorm(module), device_ids=None, **kwargs)


def without_sync_batchnorm(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with its SyncBN layers reverted to BN (said once in the log): SyncBatchNorm has
    no CPU implementation."""
    if any(isinstance(m, torch.nn.SyncBatchNorm) or 'SyncBatchNorm' in type(m).__name__
           for m in module.modules()):
        print_log('SyncBN has no CPU implementation: reverted to BN, each process '
                  'normalises with its own batch statistics.', logger='current', level=30)
        module = revert_sync_batchnorm(module)
    return module


def setup_cpu_distributed(cfg: Config) -> None:
    """Prepare a distributed run on CPU processes; nothing to do for GPUs or a single process.

    Sets ``env_cfg.dist_cfg.backend='gloo'`` and ``model_wrapper_cfg`` (type
    ``CPUDistributedDataParallel``, mmengine's DDP defaults: no buffer broadcast,
    ``find_unused_parameters`` from the config) and starts the gloo process group from the
    environment torchrun sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).

    Args:
        cfg (Config): A config prepared by ``deepvit_mm.apis.prepare_config`` (``launcher``
            set); modified in place.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher == 'none' or torch.cuda.is_available():
        return
    if launcher not in ('pytorch', 'slurm'):
        raise RuntimeError(
            f'--launcher {launcher} on a machine without CUDA: mmengine starts {launcher} runs '
            'for GPUs only. Launch CPU processes with torchrun (tools/dist_train.sh CONFIG NPROC) '
            'or under Slurm (tools/slurm_train.sh).')
    _cpu_strategy(cfg)
    env_cfg = cfg.setdefault('env_cfg', {})
    dist_cfg = dict(env_cfg.get('dist_cfg') or {})
    if dist_cfg.get('backend', 'nccl') != 'gloo':
        print_log(f'no CUDA: distributed backend {dist_cfg.get("backend", "nccl")!r} -> gloo',
                  logger='current')
        dist_cfg['backend'] = 'gloo'
    env_cfg['dist_cfg'] = dist_cfg
    if cfg.get('runner_type') != 'FlexibleRunner':  # mmengine's Runner: model_wrapper_cfg
        wrapper = _cpu_ddp_wrapper(cfg.get('model_wrapper_cfg'))
        wrapper.setdefault('find_unused_parameters', cfg.get('find_unused_parameters', False))
        cfg.model_wrapper_cfg = wrapper
    if not dist.is_initialized():
        if launcher == 'slurm':
            _slurm_environment(dist_cfg.get('port'))
        if 'RANK' not in os.environ:
            raise RuntimeError('--launcher pytorch needs the environment torchrun sets (RANK, '
                               'WORLD_SIZE, ...): start with tools/dist_train.sh CONFIG NPROC.')
        timeout = dist_cfg.get('timeout')
        kwargs = dict(timeout=datetime.timedelta(seconds=timeout)) if timeout else {}
        dist.init_process_group(backend='gloo', **kwargs, **_attempt_store(kwargs.get('timeout')))


def _attempt_store(timeout=None) -> dict:
    """Under torchrun on one node, the store of this attempt: after a restart (``--max-restarts``)
    the group meets in the agent's store again, which still holds the failed group's keys; gloo
    would read the dead workers' addresses from them and wait on those connections for ever. The
    keys of each attempt get their own prefix (every worker of one agent has its restart count).
    Elsewhere {} (``env://``). On several nodes the restart counts differ (an agent whose workers
    did not fail restarts them without counting), so no prefix can be agreed on: the restarts need
    a fresh store each round (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, as tools/dist_train.sh
    sets), and a run that may restart without one is warned."""
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT')
    if attempt is None:
        return {}
    if os.environ.get('GROUP_WORLD_SIZE', '1') != '1':
        if (os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
                and os.environ.get('TORCHELASTIC_MAX_RESTARTS', '0') != '0'):
            print_log('torchrun shares its rendezvous store across restarts of a group on '
                      'several nodes: a restarted group hangs in it. Set '
                      'TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun (tools/dist_train.sh '
                      'does).', logger='current', level=30)
        return {}
    store, rank, world_size = next(dist.rendezvous(
        'env://', timeout=timeout or datetime.timedelta(minutes=30)))
    return dict(store=dist.PrefixStore(f'attempt_{attempt}/', store), rank=rank,
                world_size=world_size)


def _slurm_environment(port=None) -> None:
    """The environment mmengine's slurm launcher sets from Slurm's, for CPU processes."""
    missing = [k for k in ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST') if k not in os.environ]
    if missing:
        raise RuntimeError(f'--launcher slurm without {", ".join(missing)}: start it with srun '
                           '(tools/slurm_train.sh), or use --launcher pytorch under torchrun.')
    if 'MASTER_ADDR' not in os.environ:
        if shutil.which('scontrol') is None:
            raise RuntimeError('--launcher slurm: scontrol is not on PATH to name the first node '
                               'of SLURM_NODELIST; set MASTER_ADDR to it.')
        out = subprocess.run(['scontrol', 'show', 'hostname', os.environ['SLURM_NODELIST']],
                             capture_output=True, text=True, check=True).stdout.split()
        os.environ['MASTER_ADDR'] = out[0]
    if port is not None:
        os.environ['MASTER_PORT'] = str(port)
    os.environ.setdefault('MASTER_PORT', '29500')
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')


def _cpu_ddp_wrapper(wrapper: Optional[dict]) -> dict:
    """A DDP model-wrapper config (the Runner's ``model_wrapper_cfg`` or a ``DDPStrategy``'s
    ``model_wrapper``) for CPU processes: mmengine's DDP becomes ``CPUDistributedDataParallel``,
    buffers are not broadcast unless the config says so."""
    wrapper = dict(wrapper or {})
    if wrapper.get('type', 'MMDistributedDataParallel') == 'MMDistributedDataParallel':
        wrapper['type'] = 'CPUDistributedDataParallel'
    wrapper.setdefault('broadcast_buffers', False)
    return wrapper


def _cpu_strategy(cfg: Config) -> None:
    """A ``FlexibleRunner``'s strategy on CPU processes: its model wrapper without GPU ids
    (``CPUFullyShardedDataParallel`` for ``FSDPStrategy``, ``CPUDistributedDataParallel`` for
    ``DDPStrategy``); FSDP refused at once on a torch that cannot run it on CPU;
    ``DeepSpeedStrategy`` left to DeepSpeed's CPU accelerator (tried, not tested:
    docs/training.md)."""
    if cfg.get('runner_type') != 'FlexibleRunner':
        return
    strategy = cfg.setdefault('strategy', {})
    kind = strategy.get('type', 'DDPStrategy')
    wrapper = dict(strategy.get('model_wrapper') or {})
    if kind in ('FSDPStrategy', 'GlobalNormFSDPStrategy'):
        problem = cpu_fsdp_problem()
        if problem:
            raise RuntimeError(problem)
        if wrapper.get('type', 'MMFullyShardedDataParallel') == 'MMFullyShardedDataParallel':
            wrapper['type'] = 'CPUFullyShardedDataParallel'
        if strategy.get('state_dict_cfg') == 'full':
            # mmengine's 'full' gathers with offload_to_cpu=True, which segfaults in CPU processes
            # on gloo; the shards are in CPU memory already
            strategy['state_dict_cfg'] = dict(
                state_dict_type='FULL_STATE_DICT',
                state_dict_config=dict(type='FullStateDictConfig', rank0_only=True,
                                       offload_to_cpu=False),
                optim_state_dict_config=dict(type='FullOptimStateDictConfig', rank0_only=True,
                                             offload_to_cpu=False))
    elif kind == 'DDPStrategy':
        wrapper = _cpu_ddp_wrapper(wrapper)
    elif kind == 'DeepSpeedStrategy':
        return
    else:
        raise RuntimeError(f'strategy {kind!r} on a machine without CUDA: CPU processes train '
                           'with DDPStrategy or FSDPStrategy (docs/training.md).')
    strategy['model_wrapper'] = wrapper
