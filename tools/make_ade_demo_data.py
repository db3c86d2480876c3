"""Write the segmentation demo dataset (synthetic scenes, ADE20k's ADEChallengeData2016 layout)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from deepvit_tools.demo_data import DatasetError, check_ade_dataset, make_ade_demo  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('root', nargs='?', default='data/ade_demo',
                   help='output folder (gets images/ and annotations/)')
    p.add_argument('--num-train', type=int, default=300)
    p.add_argument('--num-val', type=int, default=60)
    p.add_argument('--size', type=int, default=256,
                   help='image height; widths are size to 11/8 x size')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--overwrite', action='store_true', help='rewrite an existing dataset')
    p.add_argument('--check', action='store_true',
                   help='only check that ROOT is a usable ADEChallengeData2016-layout folder '
                        '(the demo data or the real ADE20k) and exit')
    return p.parse_args()


def main():
    a = parse_args()
    if a.check:
        try:
            counts = check_ade_dataset(a.root)
        except DatasetError as e:
            sys.exit(str(e))
        print(f'{a.root}: ok: ' + ', '.join(f'{k} {v["images"]} images' for k, v in counts.items()))
        return
    out = make_ade_demo(a.root, a.num_train, a.num_val, a.size, a.seed, a.overwrite)
    verb = f'wrote in {out["seconds"]} s' if out['created'] else 'already there'
    print(f'{a.root}: {verb}: training {out["training"]["images"]} images, validation '
          f'{out["validation"]["images"]} images; ADE20k classes {", ".join(out["classes"])} '
          '(label 0 = unlabelled)')


if __name__ == '__main__':
    main()
