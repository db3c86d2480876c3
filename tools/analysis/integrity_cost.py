"""What the checkpoint integrity checks cost, next to reading the file: the zip CRC-32 check, the
SHA-256 of a cached download and ``torch.load(weights_only=True)``, interleaved in one process
(the benchmark harness's ``measure.timings``: one untimed call of each, then rotating order).

    python tools/analysis/integrity_cost.py [--mib 400] [--repeat 5] [CHECKPOINT]

Without CHECKPOINT, a zip checkpoint of ``--mib`` MiB of float32 tensors is written to a temporary
folder (and removed).
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('checkpoint', nargs='?')
    p.add_argument('--mib', type=int, default=400)
    p.add_argument('--repeat', type=int, default=5)
    args = p.parse_args()
    import torch

    from deepvit_mm.checkpoints.integrity import sha256_of, zip_problem
    from deepvit_tools.benchmark.measure import timings
    tmp = None
    path = args.checkpoint
    if path is None:
        tmp = tempfile.mkdtemp()
        path = os.path.join(tmp, 'checkpoint.pth')
        torch.save({'state_dict': {f'w{i}': torch.randn(1024, 1024) for i in range(args.mib // 4)}},
                   path)
    try:
        timed = timings({'zip CRC-32 check': lambda: zip_problem(path),
                         'SHA-256': lambda: sha256_of(path),
                         'torch.load(weights_only=True)':
                             lambda: torch.load(path, weights_only=True)},
                        warmup=1, repeats=args.repeat)
        print(f'{path}: {os.path.getsize(path) / 2**20:.0f} MiB, torch {torch.__version__}, '
              f'{args.repeat} interleaved runs')
        for name, m in timed.items():
            print(f'  {name}: median {m.median:.3f} s (min {min(m.times):.3f}, '
                  f'max {max(m.times):.3f})')
    finally:
        if tmp:
            shutil.rmtree(tmp)


if __name__ == '__main__':
    main()
