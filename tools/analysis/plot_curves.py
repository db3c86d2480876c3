"""Draw a training run's losses and held-out metrics against iterations, from mmengine's
``vis_data/scalars.json`` (deepvit_mm/visualization/curves.py says how it is read).

    python tools/analysis/plot_curves.py work_dirs/demo --out curves.png
    python tools/analysis/plot_curves.py work_dirs/demo/20250101_120000/vis_data/scalars.json \\
        --losses loss loss_rpn_cls --metrics coco/bbox_mAP coco/segm_mAP --out curves.png

mmdet's and mmseg's own tools/analysis_tools/analyze_logs.py plot_curve read the same file
(docs/visualization.md).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def parse_args():
    parser = argparse.ArgumentParser(description='Draw training curves from mmengine\'s log')
    parser.add_argument('log', help='a scalars.json, or a work dir (its newest training run\'s)')
    parser.add_argument('--out', default='curves.png', help='the picture (.png, .pdf, .svg)')
    parser.add_argument('--losses', nargs='+', help='training keys (default: every loss)')
    parser.add_argument('--metrics', nargs='*',
                        help='validation keys (default: the mAPs / mIoU; none: no right panel)')
    parser.add_argument('--title', help='above the picture (default: the log\'s path)')
    return parser.parse_args()


def main():
    args = parse_args()
    from deepvit_mm.visualization.curves import find_scalars, plot_curves, read_scalars
    try:
        scalars = read_scalars(find_scalars(args.log))
        plot_curves(scalars, args.out, args.losses, args.metrics, args.title)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(str(e))
    print(f'curves of {scalars.path} drawn in {args.out}')


if __name__ == '__main__':
    main()
