"""Export a config's model (Mask R-CNN, Semantic FPN / UperNet) or its XCiT / CaiT backbone to ONNX.

The file takes one input, ``input``: the image after the model's data preprocessor (normalised,
padded), ``[1, 3, H, W]``. Outputs: backbone (--backbone-only): its pyramid maps ``stride4`` ...
``stride32``; segmentor: ``seg_logits`` ``[1, K, H, W]``; detector: ``dets`` ``[1, N, 5]``
(x1, y1, x2, y2, score in input pixels), ``labels`` ``[1, N]``, ``masks`` ``[1, N, 28, 28]``
(mmdeploy's end-to-end layout). Without --dynamic the file accepts only --shape; with it, any
height and width that are multiples of 32 in [64, 2048] (CaiT with windowed attention: from the
first size above one window, e.g. 256). After exporting, the file is run in ONNX
Runtime against PyTorch on a random input (at --shape, and with --dynamic at a second size).

Examples:
  python tools/deploy/export_onnx.py configs/demo/sem_fpn_xcit_nano_12_p16_ade_demo.py \\
      work_dirs/sem_fpn/iter_500.pth --out sem_fpn.onnx --shape 256 320 --dynamic
  python tools/deploy/export_onnx.py configs/mask_rcnn_xcit_s12_8_3x.py mask_rcnn.pth \\
      --out xcit_s12_8.onnx --shape 800 1344 --backbone-only

docs/deployment.md: the contract, how the exporter works and what it was checked against.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config', help='mmdet or mmseg config with a deepvit_mm backbone')
    p.add_argument('checkpoint', help="the trained model's checkpoint (.pth, .safetensors, "
                                      'http(s):// URL), read by the safe loader; with '
                                      '--backbone-only also a classification/timm checkpoint; '
                                      "'none': random weights (for speed measurements)")
    p.add_argument('--out', required=True, help='the .onnx file to write')
    p.add_argument('--shape', nargs=2, type=int, default=[512, 512], metavar=('H', 'W'),
                   help='input height and width (with --dynamic: the traced example; multiples '
                        'of 32). Default: 512 512')
    p.add_argument('--dynamic', action='store_true',
                   help='one file for any H and W that are multiples of 32 in [64, 2048] '
                        '(windowed CaiT: from 256)')
    p.add_argument('--backbone-only', action='store_true',
                   help='export the backbone (its pyramid maps) instead of the whole model')
    p.add_argument('--opset', type=int, default=18, help='ONNX opset (default: 18)')
    p.add_argument('--no-verify', action='store_true',
                   help='skip the ONNX Runtime run against PyTorch after exporting')
    p.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import deepvit_mm  # noqa: F401  (registers the backbones, safe checkpoint loading)
    from deepvit_mm.deploy import (
        check_export,
        dynamic_range,
        export_onnx,
        load_model,
        onnx_dynamo_export_problem,
        onnxruntime_session,
        wrap_for_export,
    )
    problem = onnx_dynamo_export_problem()
    if problem:  # before building anything
        sys.exit(problem)
    checkpoint = None if args.checkpoint.lower() == 'none' else args.checkpoint
    model, task = load_model(args.config, checkpoint, args.cfg_options, args.backbone_only)
    wrapper = wrap_for_export(model, task, args.backbone_only)
    try:
        export_onnx(wrapper, args.out, args.shape, dynamic=args.dynamic, opset=args.opset)
    except ValueError as e:
        sys.exit(str(e))
    lo, hi = dynamic_range(wrapper)
    sizes = (f'H, W: multiples of 32 in [{lo}, {hi}]' if args.dynamic
             else f'H, W = {args.shape[0]}, {args.shape[1]} only')
    print(f'wrote {args.out}: input [1, 3, H, W] ({sizes}); outputs '
          f'{", ".join(wrapper.output_names)}')
    if args.no_verify:
        return
    h, w = args.shape
    shapes = [(h, w)]
    if args.dynamic:
        shapes.append((min(h + 64, hi), max(w - 64, lo)))
    for row in check_export(wrapper, onnxruntime_session(args.out), shapes):
        print('ONNX Runtime vs PyTorch at {}x{}: {}'.format(
            *row.pop('shape'), ', '.join(f'{k} {v:.3g}' if isinstance(v, float) else f'{k} {v}'
                                         for k, v in row.items())))


if __name__ == '__main__':
    main()
