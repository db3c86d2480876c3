"""Draw a detector's or segmentor's feature maps over images, with mmyolo's
``demo/featmap_vis_demo.py`` flags; each level cropped to the image's unpadded region before it is
resized to the image (deepvit_mm/visualization/featmaps.py says how).

    python tools/analysis/featmap_vis.py demo.jpg configs/mask_rcnn_xcit_s12_8_3x.py model.pth
    python tools/analysis/featmap_vis.py images/ a.jpg CONFIG CKPT --target-layers backbone neck \\
        --channel-reduction none --topk 4 --arrangement 2 2 --save-arrays --device cpu

writes OUT_DIR/<image>_<layer>_0.png (every level of the layer, labelled with its stride) through
the config's visualization backends, and with --save-arrays OUT_DIR/<image>_<layer>_0.npz beside
it (one float32 array a level, named stride_<s>, at the image's size).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402

CHANNEL_REDUCTIONS = ('squeeze_mean', 'select_max', 'none')  # featmaps.CHANNEL_REDUCTIONS


def parse_args():
    parser = argparse.ArgumentParser(description='Draw feature maps over images')
    parser.add_argument('img', nargs='+', help='image files or folders of images')
    parser.add_argument('config', help='mmdet or mmseg config file')
    parser.add_argument('checkpoint', help='checkpoint: a .pth or .safetensors file, or an '
                                           'http(s):// URL')
    parser.add_argument('--target-layers', nargs='+', default=['backbone'],
                        help='layers whose outputs are drawn: backbone (every pyramid level), '
                             'neck, or a module inside them (default: backbone)')
    parser.add_argument('--preview-model', action='store_true',
                        help='print the model\'s modules (the layer names) and stop')
    parser.add_argument('--out-dir', default='./output', help='where the pictures go')
    parser.add_argument('--device', help="default: 'cuda:0' when available, else 'cpu'")
    parser.add_argument('--channel-reduction', default='select_max', choices=CHANNEL_REDUCTIONS,
                        help='a level drawn as its channels\' mean, its channel of the largest '
                             'sum, or (none) its --topk channels of the largest sums')
    parser.add_argument('--topk', type=int, default=4,
                        help='--channel-reduction none: the channels drawn a level')
    parser.add_argument('--arrangement', nargs=2, type=int, default=[2, 2],
                        metavar=('ROWS', 'COLUMNS'),
                        help='--channel-reduction none: a level\'s channels in rows x columns')
    parser.add_argument('--alpha', type=float, default=0.5,
                        help='the maps\' weight over the image, in [0, 1]')
    parser.add_argument('--save-arrays', action='store_true',
                        help='also write each picture\'s maps as an .npz beside it')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries')
    return parser.parse_args()


def main():
    args = parse_args()
    import deepvit_mm  # noqa: F401  (registers the backbones, safe checkpoint loading)
    from deepvit_mm.checkpoints import CheckpointError
    from deepvit_mm.models.utils.consumers import ChannelMismatchError
    from deepvit_mm.visualization import FeatmapExtractor, VisualizationError, visualize_featmaps
    try:
        if args.preview_model:
            extractor = FeatmapExtractor(args.config, args.checkpoint, args.target_layers,
                                         args.device, args.cfg_options)
            print(extractor.preview())
            return
        written = visualize_featmaps(
            args.img, args.config, args.checkpoint, args.out_dir, layers=args.target_layers,
            channel_reduction=args.channel_reduction, topk=args.topk,
            arrangement=tuple(args.arrangement), alpha=args.alpha,
            save_arrays=args.save_arrays, device=args.device, cfg_options=args.cfg_options)
    except (VisualizationError, FileNotFoundError, CheckpointError, ChannelMismatchError,
            ImportError) as e:
        sys.exit(str(e) or type(e).__name__)
    print(f'{len(written)} files written in {args.out_dir}: '
          f'{", ".join(os.path.basename(f) for f in written[:6])}'
          + (', ...' if len(written) > 6 else ''))


if __name__ == '__main__':
    main()
