"""Draw a detector's or segmentor's predictions on an image (mmdet's / mmseg's inferencers).

The config says which (its default_scope); the weights are a checkpoint file or an http(s) URL,
read by deepvit_mm's checkpoint loader (URLs are downloaded once to the torch hub cache).

    python demo/image_demo.py demo.jpg configs/mask_rcnn_xcit_s12_16_3x.py \\
        --weights https://dl.fbaipublicfiles.com/xcit/coco/maskrcnn_xcit_small_12_p16.pth

writes outputs/vis/demo.jpg (the drawing) and outputs/preds/demo.json (detection) or
outputs/pred/00000000_pred.png (segmentation: class indices, numbered in input order).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args():
    parser = argparse.ArgumentParser(description='Draw predictions on an image')
    parser.add_argument('image', help='image file (or a folder of images)')
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('--weights', required=True,
                        help='checkpoint: a .pth or .safetensors file, or an http(s):// URL')
    parser.add_argument('--out-dir', default='outputs',
                        help='the drawing goes to OUT_DIR/vis, the predictions next to it')
    parser.add_argument('--device', help="default: 'cuda:0' when available, else 'cpu'")
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detection: draw boxes scoring at least this')
    parser.add_argument('--show', action='store_true', help='also show the drawing in a window')
    return parser.parse_args()


def main():
    args = parse_args()
    import deepvit_mm  # noqa: F401  (registers the backbones, safe checkpoint loading)
    from deepvit_mm.runtime import build_inferencer
    try:
        inferencer, task = build_inferencer(args.config, args.weights, args.device)
    except (FileNotFoundError, RuntimeError) as e:
        sys.exit(str(e))
    if task == 'det':
        inferencer(args.image, out_dir=args.out_dir, pred_score_thr=args.score_thr,
                   show=args.show, no_save_pred=False)
    else:
        inferencer(args.image, out_dir=args.out_dir, show=args.show)
    print(f'drawn into {os.path.join(args.out_dir, "vis")}')


if __name__ == '__main__':
    main()
