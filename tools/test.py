"""Evaluate a checkpoint with an mmdet or mmseg config (told apart by its default_scope)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mmengine.config import DictAction  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from deepvit_mm.apis import (  # noqa: E402
    VIS_BACKENDS,
    enable_tta,
    enable_visualization,
    objects_frozen,
    prepare_config,
    set_test_out,
    set_vis_backends,
)
from deepvit_mm.checkpoints import require_complete_model, resolve_checkpoint  # noqa: E402
from deepvit_mm.engine import (  # noqa: E402
    allocator_note,
    mmcv_ops_device_problem,
    setup_cpu_distributed,
    setup_cpu_malloc,
)


def parse_args():
    parser = argparse.ArgumentParser(description='Test (evaluate) a checkpoint')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint: a .pth or .safetensors file, or an '
                                           'http(s):// URL (downloaded once to the torch hub cache)')
    parser.add_argument('--work-dir', help='where logs and metrics go')
    parser.add_argument('--out', help='keep the predictions for offline evaluation: mmdet configs '
                                      'a .pkl file (mmdet\'s DumpDetResults, what its '
                                      'tools/analysis_tools read), mmseg configs a folder of '
                                      'class-index .png files')
    parser.add_argument('--show-dir', help='draw predictions into this folder (for mmdet: '
                                           'under work_dir/<timestamp>/)')
    parser.add_argument('--show', action='store_true', help='show predictions in a window')
    parser.add_argument('--wait-time', type=float, default=2, help='seconds each window shows')
    parser.add_argument('--tta', action='store_true',
                        help='test-time augmentation: the config\'s tta_model and tta_pipeline')
    parser.add_argument('--vis-backend', nargs='+', metavar='NAME',
                        help='where scalars and drawn predictions go, any of '
                             f'{", ".join(VIS_BACKENDS)} (mmengine\'s backends; local: '
                             'work_dir/<timestamp>/vis_data, tensorboard: event files there)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries')
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
    try:
        checkpoint = resolve_checkpoint(args.checkpoint)  # ~ expanded, URLs downloaded
    except (FileNotFoundError, RuntimeError) as e:
        sys.exit(str(e))
    try:  # a wrong --out, a missing package: one line, before testing starts
        cfg = prepare_config(args.config, work_dir=args.work_dir, cfg_options=args.cfg_options,
                             launcher=args.launcher, load_from=checkpoint)
        set_vis_backends(cfg, args.vis_backend)
        set_test_out(cfg, args.out)
    except (FileNotFoundError, ValueError, ImportError) as e:
        sys.exit(str(e))
    setup_cpu_distributed(cfg)  # gloo on a machine without CUDA; GPU runs: mmengine's own
    if args.show or args.show_dir:
        enable_visualization(cfg, args.show_dir, args.show, args.wait_time)
    if args.tta:
        enable_tta(cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    problem = mmcv_ops_device_problem(runner.model)  # a GPU model, mmcv built for the CPU
    if problem:
        sys.exit(problem)
    if malloc:
        runner.logger.info(allocator_note(malloc))
    # as tools/train.py: what exists now is never walked by a collection again while testing;
    # a backbone-only checkpoint would evaluate to mAP 0
    with objects_frozen(), require_complete_model():
        runner.test()


if __name__ == '__main__':
    main()
