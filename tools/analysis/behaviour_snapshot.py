"""Write what the backbones do to a file, or compare two such files value by value: run it on
the code before a change and after, then compare (deepvit_tools/snapshot.py says what is in it).

    python tools/analysis/behaviour_snapshot.py save before.pt
    # ... change the code ...
    python tools/analysis/behaviour_snapshot.py save after.pt
    python tools/analysis/behaviour_snapshot.py compare before.pt after.pt

``compare`` prints how many values it compared and each key that differs, and exits with 1 when
one does. ``--families XCiT CaiT`` takes some families only, ``--archs nano_12_p16`` builds some
archs only.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def parse_args():
    parser = argparse.ArgumentParser(description="Save or compare what the backbones do")
    sub = parser.add_subparsers(dest='command', required=True)
    save = sub.add_parser('save', help='write the snapshot to FILE')
    save.add_argument('file')
    save.add_argument('--families', nargs='+', help='family names (default: every family)')
    save.add_argument('--archs', nargs='+',
                      help="build only these of deepvit_tools/snapshot.py's BUILDS (default: all)")
    cmp = sub.add_parser('compare', help='compare two snapshots')
    cmp.add_argument('before')
    cmp.add_argument('after')
    return parser.parse_args()


def _load(path: str) -> dict:
    import torch
    if not os.path.isfile(path):
        raise SystemExit(f'{path}: no such file; write it with '
                         f'`python tools/analysis/behaviour_snapshot.py save {path}`')
    return torch.load(path, map_location='cpu', weights_only=True)


def main() -> int:
    args = parse_args()
    import torch

    from deepvit_tools.snapshot import compare, snapshot
    if args.command == 'save':
        snap = snapshot(args.families, args.archs)
        torch.save(snap, args.file)
        print(f'{len(snap)} entries written to {args.file}')
        return 0
    compared, diffs = compare(_load(args.before), _load(args.after))
    print('\n'.join(diffs))
    print(f'{compared} values compared, {len(diffs)} entries differ')
    return 1 if diffs else 0


if __name__ == '__main__':
    sys.exit(main())
