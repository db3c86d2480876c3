"""Draw a detector's or segmentor's predictions on images (mmdet's / mmseg's inferencers), with
mmdet's ``demo/image_demo.py`` flags.

The model is a config file (its default_scope says detector or segmentor) or a model name of
model-index.yml, whose released weights are taken when no ``--weights`` is given; weights are a
checkpoint file or an http(s) URL, read by deepvit_mm's checkpoint loader (URLs are downloaded
once to the torch hub cache).

    python demo/image_demo.py demo.jpg configs/mask_rcnn_xcit_s12_16_3x.py \\
        --weights https://dl.fbaipublicfiles.com/xcit/coco/maskrcnn_xcit_small_12_p16.pth
    python demo/image_demo.py demo.jpg mask_rcnn_xcit_s12_16_3x --pred-score-thr 0.5

writes outputs/vis/demo.jpg (the drawing) and outputs/preds/demo.json (detection) or
outputs/pred/00000000_pred.png (segmentation: class indices, numbered in input order).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PALETTES = ('coco', 'voc', 'citys', 'random', 'none')  # deepvit_mm.apis.PALETTES


def parse_args():
    parser = argparse.ArgumentParser(description='Draw predictions on images')
    parser.add_argument('inputs', help='image file or folder of images')
    parser.add_argument('model', help='mmdet or mmseg config file, or a model name of '
                                      'model-index.yml (e.g. mask_rcnn_xcit_s12_16_3x)')
    parser.add_argument('--weights', help='checkpoint: a .pth or .safetensors file, or an '
                                          'http(s):// URL; default: the model\'s released weights')
    parser.add_argument('--out-dir', default='outputs',
                        help='the drawings go to OUT_DIR/vis, the predictions next to them')
    parser.add_argument('--texts', help='text prompts: for mmdet\'s open-vocabulary detectors '
                                        'only, refused here')
    parser.add_argument('--device', help="default: 'cuda:0' when available, else 'cpu'")
    parser.add_argument('--pred-score-thr', type=float, default=0.3,
                        help='detection: draw boxes scoring at least this')
    parser.add_argument('--score-thr', type=float,
                        help='deprecated: the former name of --pred-score-thr')
    parser.add_argument('--batch-size', type=int, default=1, help='images an inference batch')
    parser.add_argument('--show', action='store_true', help='also show the drawings in a window')
    parser.add_argument('--no-save-vis', action='store_true', help='save no drawing')
    parser.add_argument('--no-save-pred', action='store_true', help='save no prediction file')
    parser.add_argument('--print-result', action='store_true', help='print the predictions')
    parser.add_argument('--palette', default='none', choices=PALETTES,
                        help="colours drawn: a dataset's, random, or (none) the checkpoint's or "
                             "the config dataset's")
    args = parser.parse_args()
    if args.texts is not None:
        parser.error("--texts: this repo's models detect the classes they were trained on; text "
                     "prompts are for mmdet's GLIP and Grounding DINO")
    if args.score_thr is not None:
        print('--score-thr is deprecated: use --pred-score-thr', file=sys.stderr)
        args.pred_score_thr = args.score_thr
    return args


def main():
    args = parse_args()
    import deepvit_mm  # noqa: F401  (registers the backbones, safe checkpoint loading)
    from deepvit_mm.apis import build_inferencer, resolve_model, run_inferencer
    try:
        config, weights = resolve_model(args.model, args.weights)
        inferencer, task = build_inferencer(config, weights, args.device, args.palette)
    except (FileNotFoundError, RuntimeError) as e:
        sys.exit(str(e))
    run_inferencer(inferencer, task, args.inputs, out_dir=args.out_dir,
                   pred_score_thr=args.pred_score_thr, batch_size=args.batch_size,
                   show=args.show, no_save_vis=args.no_save_vis, no_save_pred=args.no_save_pred,
                   print_result=args.print_result)
    if args.out_dir and not (args.no_save_vis and args.no_save_pred):
        print(f'results have been saved at {args.out_dir}')


if __name__ == '__main__':
    main()
