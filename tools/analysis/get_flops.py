"""Parameters and FLOPs of configs' models: backbone / neck / heads apart, attention counted.

FLOPs are multiply-adds (fvcore's and mmdet/mmseg's get_flops convention) of one inference
forward at --shape (default: 800x1344 for detection, 512x512 for segmentation); the backbone,
neck and dense heads are counted on the meta device, so a full-size count takes a second. How
each part is counted: deepvit_tools/benchmark/flops.py.

    python tools/analysis/get_flops.py configs/mask_rcnn_xcit_s12_8_3x.py
    python tools/analysis/get_flops.py configs/*.py --json flops.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description='Count parameters and FLOPs of configs\' models')
    parser.add_argument('configs', nargs='+', help='mmdet or mmseg config files')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input height and width (default: 800 1344 detection, 512 512 '
                             'segmentation)')
    parser.add_argument('--json', metavar='FILE', help='also write every count to FILE')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries')
    return parser.parse_args()


def main():
    args = parse_args()
    import deepvit_mm  # noqa: F401  (registers the backbones)
    from deepvit_tools.benchmark.flops import config_flops, flops_markdown
    reports = []
    for config in args.configs:
        reports.append(config_flops(config, args.shape, args.cfg_options))
        print('\n'.join(flops_markdown(reports[-1:])[2 if len(reports) > 1 else 0:]), flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump([dict(config=c, shape=list(r.shape), task=r.task, **r.summary(),
                            parts={k: vars(p) for k, p in r.parts.items()})
                       for c, r in zip(args.configs, reports)], f, indent=1)


if __name__ == '__main__':
    main()
