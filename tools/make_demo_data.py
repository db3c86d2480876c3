"""Write the embedded demo dataset (synthetic shapes, COCO instances format)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from deepvit_tools.demo_data import make_shapes_coco  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('root', nargs='?', default='data/shapes', help='output folder')
    p.add_argument('--num-train', type=int, default=400)
    p.add_argument('--num-val', type=int, default=60)
    p.add_argument('--size', type=int, default=256)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--overwrite', action='store_true', help='rewrite an existing dataset')
    return p.parse_args()


def main():
    a = parse_args()
    out = make_shapes_coco(a.root, a.num_train, a.num_val, a.size, a.seed, a.overwrite)
    verb = f'wrote in {out["seconds"]} s' if out['created'] else 'already there'
    print(f'{a.root}: {verb}: train {out["train"]["images"]} images / '
          f'{out["train"]["objects"]} objects, val {out["val"]["images"]} images / '
          f'{out["val"]["objects"]} objects; classes {", ".join(out["classes"])}')


if __name__ == '__main__':
    main()
