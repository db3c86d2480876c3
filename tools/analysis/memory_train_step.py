"""Peak memory of one training step (CPU), with and without gradient checkpointing.

Each measurement runs in a fresh process (deepvit_tools.benchmark.run_isolated):
    python tools/analysis/memory_train_step.py configs/mask_rcnn_xcit_s12_8_3x.py            # both
    python tools/analysis/memory_train_step.py CONFIG --with-cp on --height 800 --width 1344  # one

Prints a line per measurement, then the results as JSON (a list for "both"); docs/benchmark.md.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Peak memory of one training step on CPU')
    parser.add_argument('config', help='mmdet or mmseg config with a deepvit_mm backbone')
    parser.add_argument('--with-cp', choices=['on', 'off', 'both'], default='both',
                        help='backbone gradient checkpointing; "both": one process each')
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--height', type=int, default=800)
    parser.add_argument('--width', type=int, default=1344)
    parser.add_argument('--num-objects', type=int, default=10, help='instances per image (det)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries')
    parser.add_argument('--timeout', type=float, help='seconds per measurement (default: none)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from deepvit_tools.benchmark import IsolatedError, measure_train_step, run_isolated
    flags = ('off', 'on') if args.with_cp == 'both' else (args.with_cp,)
    results = []
    for flag in flags:
        try:
            results.append(run_isolated(
                measure_train_step, args.config, with_cp=flag == 'on', timeout=args.timeout,
                batch_size=args.batch_size, height=args.height, width=args.width,
                num_objects=args.num_objects, cfg_options=args.cfg_options))
        except IsolatedError as e:
            sys.exit(f'--with-cp {flag} failed: {e}')
    for r in results:
        print(f"with_cp={r['with_cp']!s:5}  peak RSS {r['peak_rss_mib']:8.0f} MiB  "
              f"(before the step {r['before_step_mib']:.0f}, step {r['step_peak_mib']:.0f})  "
              f"{r['step_seconds']:.1f} s  loss {r['loss']:.3f}")
    print(json.dumps(results if args.with_cp == 'both' else results[0]))


if __name__ == '__main__':
    main()
