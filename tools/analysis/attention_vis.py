"""Draw attention maps over images, for every family: XCiT's and CaiT's class attention (from the
classification weights), the CLS token's attention of ViT, DeiT III, DINOv2, EVA-02 and BEiT, and
a chosen patch's attention inside a detector's or segmentor's backbone (CaiT and those families);
each map the weights timm's attention module applies to its values, laid over the image with the
feature maps' alignment (deepvit_mm/visualization/attention.py says how).

    # class attention of an XCiT classifier, every layer, per head and the heads' mean
    python tools/analysis/attention_vis.py cat.jpg xcit_small_12_p8_224 xcit_s12_p8.pth
    # DINO's picture: the CLS token's attention in the last block, the top 60 % of its mass
    python tools/analysis/attention_vis.py cat.jpg vit_small_patch8_224.dino --threshold 0.6
    # a patch's attention in a detector's global block
    python tools/analysis/attention_vis.py demo.jpg configs/mask_rcnn_cait_xxs24_3x.py \\
        model.pth --patch 320,240 --block 23
    # a detector without class-attention layers: its pretrained classifier's
    python tools/analysis/attention_vis.py demo.jpg configs/mask_rcnn_xcit_s12_8_3x.py \\
        model.pth --attention class --classifier xcit_small_12_p8_224.fb_in1k

writes OUT_DIR/<image>_<map>_<head>_0.png (each head, and the heads' mean as `mean`) through
mmengine's visualization backends (a config's own, or --vis-backend), and with --save-arrays
OUT_DIR/<image>_<map>_<head>_0.npz beside each (`map`: float32 at the image's size; `mask`: what
--threshold kept). A classifier's weights default to timm's on the Hugging Face hub.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402

ATTENTIONS = ('auto', 'class', 'cls', 'patch')  # 'auto' and attention.ATTENTION_KINDS


def parse_args():
    parser = argparse.ArgumentParser(description='Draw attention maps over images')
    parser.add_argument('img', help='image file or folder of images')
    parser.add_argument('model', help='a timm classifier\'s name (xcit_small_12_p8_224, '
                                      'vit_small_patch16_224.dino), or an mmdet or mmseg config file')
    parser.add_argument('checkpoint', nargs='?',
                        help='its weights: a .pth or .safetensors file, an http(s):// URL or an '
                             'hf-hub: name (a config: required; a classifier: default timm\'s '
                             'pretrained weights of the name)')
    parser.add_argument('--attention', default='auto', choices=ATTENTIONS,
                        help='class: XCiT\'s and CaiT\'s class-attention layers; cls: the CLS '
                             'token\'s row of a block; patch: the --patch\'s row of a block; '
                             'auto: class where the classifier has it, else cls; patch for a '
                             'config')
    parser.add_argument('--block', type=int, nargs='+',
                        help='0-based blocks (cls, patch; default: the last global one) or '
                             'class-attention layers (class; default: all)')
    parser.add_argument('--patch', metavar='X,Y',
                        help='patch: the query patch\'s x,y in image pixels (default: the '
                             'image\'s centre)')
    parser.add_argument('--threshold', type=float,
                        help='also draw each map with only the top share of its attention '
                             'mass, e.g. 0.6 (DINO\'s --threshold)')
    parser.add_argument('--classifier', metavar='NAME_OR_PATH',
                        help='a config whose backbone has no class-attention layers: the '
                             'classifier to draw them from (a timm name, or a classification '
                             'checkpoint of the backbone\'s arch)')
    parser.add_argument('--input-size', type=int,
                        help='a classifier\'s input: the image\'s longer side in pixels '
                             '(default: its pretrained resolution)')
    parser.add_argument('--out-dir', default='./output', help='where the pictures go')
    parser.add_argument('--vis-backend', nargs='+', metavar='NAME',
                        help='visualization backends (local, tensorboard, wandb, ...; default: '
                             'the config\'s, a local one into --out-dir always)')
    parser.add_argument('--device', help="default: 'cuda:0' when available, else 'cpu'")
    parser.add_argument('--alpha', type=float, default=0.5,
                        help='the maps\' weight over the image, in [0, 1]')
    parser.add_argument('--save-arrays', action='store_true',
                        help='also write each picture\'s map as an .npz beside it')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries')
    return parser.parse_args()


def main():
    args = parse_args()
    import deepvit_mm  # noqa: F401  (registers the backbones, safe checkpoint loading)
    from deepvit_mm.apis import vis_backend_types
    from deepvit_mm.checkpoints import CheckpointError
    from deepvit_mm.visualization import VisualizationError, visualize_attention
    try:
        backends = None if not args.vis_backend else \
            [dict(type=t) for t in vis_backend_types(args.vis_backend)]
        written = visualize_attention(
            args.img, args.model, args.checkpoint, args.out_dir, attention=args.attention,
            blocks=args.block, patch=args.patch, threshold=args.threshold,
            classifier=args.classifier, input_size=args.input_size, alpha=args.alpha,
            save_arrays=args.save_arrays, vis_backends=backends, cfg_options=args.cfg_options,
            device=args.device)
    except (VisualizationError, CheckpointError, FileNotFoundError, ImportError, ValueError) as e:
        sys.exit(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    print(f'{len(written)} files written in {args.out_dir}: '
          f'{", ".join(os.path.basename(f) for f in written[:6])}'
          + (', ...' if len(written) > 6 else ''))


if __name__ == '__main__':
    main()
