"""Train a detector or segmentor (mmdet or mmseg config, told apart by its default_scope)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mmengine.config import DictAction  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from deepvit_mm.apis import (  # noqa: E402
    VIS_BACKENDS,
    objects_frozen,
    prepare_config,
    set_vis_backends,
)
from deepvit_mm.engine import (  # noqa: E402
    CheckpointWriteError,
    allocator_note,
    fit_precision_to_device,
    mmcv_ops_device_problem,
    setup_cpu_distributed,
    setup_cpu_malloc,
)


def parse_args():
    parser = argparse.ArgumentParser(description='Train a model from an mmdet or mmseg config')
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: float16 on GPU, bfloat16 on CPU (the Mask R-CNN recipes '
                             'train in float16 on GPU without it)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by (GPUs x samples per GPU) / the config\'s '
                             'auto_scale_lr.base_batch_size, as mmdet does')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from this checkpoint, or (no value) from the latest one in '
                             'the work dir')
    parser.add_argument('--vis-backend', nargs='+', metavar='NAME',
                        help='where scalars and drawn predictions go, any of '
                             f'{", ".join(VIS_BACKENDS)} (mmengine\'s backends; local: '
                             'work_dir/<timestamp>/vis_data, tensorboard: event files there)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_cfg.max_iters=100')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main():
    args = parse_args()
    import torch

    import deepvit_mm  # noqa: F401  (registers the backbones, safe checkpoint loading)
    # CPU: freed feature maps reused, not faulted in again (restarts this tool on tcmalloc if any)
    malloc = None if torch.cuda.is_available() else setup_cpu_malloc(__file__)
    try:  # a missing config entry or package: one line, before training starts
        cfg = prepare_config(args.config, work_dir=args.work_dir, cfg_options=args.cfg_options,
                             launcher=args.launcher, amp=args.amp, resume=args.resume,
                             auto_scale_lr=args.auto_scale_lr)
        set_vis_backends(cfg, args.vis_backend)
    except (FileNotFoundError, ValueError, ImportError) as e:
        sys.exit(str(e))
    precision_note = fit_precision_to_device(cfg)  # float16 recipes on a machine without a GPU
    setup_cpu_distributed(cfg)  # gloo on a machine without CUDA; GPU runs: mmengine's own
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    problem = mmcv_ops_device_problem(runner.model)  # a GPU model, mmcv built for the CPU
    if problem:
        sys.exit(problem)
    if malloc:
        runner.logger.info(allocator_note(malloc))
    if precision_note:
        runner.logger.warning(precision_note)
    # what exists now (the libraries' modules, the config, the model) lives until the end: no
    # collection walks it again while training
    with objects_frozen():
        try:
            runner.train()
        except CheckpointWriteError as e:  # one message, in the log too; no traceback
            from mmengine.logging import print_log
            print_log(str(e), logger='current', level=40)
            sys.exit(str(e))


if __name__ == '__main__':
    main()
