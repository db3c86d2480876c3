"""Where a training step's time goes, part by part (CPU): data preprocessor, backbone, neck,
RPN and RoI heads (or a segmentor's decode/aux heads), optimizer; forward and backward apart,
next to whole ``model.train_step`` calls timed in the same run. How the split is made:
deepvit_tools/benchmark/step.py.

    python tools/analysis/profile_train_step.py configs/mask_rcnn_xcit_s12_8_3x.py
    python tools/analysis/profile_train_step.py configs/demo/mask_rcnn_xcit_nano_12_p8_shapes.py \\
        --shape 256 256 --batch-size 4 --num-objects 3 --steps 5
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description='Time a training step by part (CPU)')
    parser.add_argument('config', help='mmdet or mmseg config with a deepvit_mm backbone')
    parser.add_argument('--shape', type=int, nargs=2, default=[800, 1344], metavar=('H', 'W'))
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--num-objects', type=int, default=10, help='instances per image (det)')
    parser.add_argument('--steps', type=int, default=3, help='timed steps of each kind')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=0, help='torch threads (0: torch default)')
    parser.add_argument('--dtype', choices=['fp32', 'bf16'], default='fp32',
                        help='float32, or bfloat16 autocast (CPUAmpOptimWrapper)')
    parser.add_argument('--json', metavar='FILE', help='also write the result to FILE')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries')
    return parser.parse_args()


def main():
    args = parse_args()
    import torch

    import deepvit_mm  # noqa: F401
    from deepvit_mm.engine import preload_tcmalloc
    preload_tcmalloc(__file__)  # as tools/train.py on CPU: tcmalloc when the system has it
    from deepvit_tools.benchmark import environment, profile_train_step, step_markdown
    if args.threads:
        torch.set_num_threads(args.threads)
    result = profile_train_step(args.config, tuple(args.shape), args.batch_size,
                                args.num_objects, args.steps, args.warmup, args.cfg_options,
                                dtype=args.dtype)
    env = environment('cpu')
    print(f"{args.config}, {args.shape[0]}x{args.shape[1]}, batch {args.batch_size}, {args.dtype}, "
          f"{result['threads']} threads, median of {args.steps} steps; "
          + ', '.join(f'{k}: {v}' for k, v in env.items()))
    print('\n'.join(step_markdown(result)))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(result, environment=env), f, indent=1)


if __name__ == '__main__':
    main()
