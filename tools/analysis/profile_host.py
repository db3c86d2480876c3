"""The host's side of a backbone's training step on a GPU (deepvit_tools/benchmark/host.py);
``--compile-blocks`` also with its blocks compiled.

    python tools/analysis/profile_host.py --arch small_12_p16 --size 800 1344 --batch 2
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def parse_args():
    parser = argparse.ArgumentParser(description="A backbone training step's host side (CUDA)")
    parser.add_argument('--arch', nargs='+', default=['small_12_p16'])
    parser.add_argument('--size', type=int, nargs=2, default=[800, 1344], metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--dtype', choices=['fp32', 'bf16', 'fp16'], default='fp16')
    parser.add_argument('--steps', type=int, default=20, help='timed steps a round')
    parser.add_argument('--rounds', type=int, default=3, help='interleaved rounds')
    parser.add_argument('--compile-blocks', action='store_true',
                        help='also profile each arch built with compile_blocks=True')
    parser.add_argument('--trace', metavar='DIR', help='write a Chrome trace per arch here')
    parser.add_argument('--json', metavar='FILE', help='also write the results to FILE')
    return parser.parse_args()


def main():
    args = parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit('profile_host.py measures a GPU: no CUDA device is visible.')
    import deepvit_mm  # noqa: F401
    from deepvit_tools.benchmark import environment, markdown_table
    from deepvit_tools.benchmark.host import host_profile
    rows, splits, results = [], [], {}
    variants = [('', {})] + ([(', compiled blocks', dict(compile_blocks=True))]
                             if args.compile_blocks else [])
    for arch in args.arch:
        for label, kwargs in variants:
            name = arch + label
            trace = os.path.join(args.trace, name.replace(', ', '_').replace(' ', '_') + '.json') \
                if args.trace else None
            if trace:
                os.makedirs(args.trace, exist_ok=True)
            results[name] = host_profile(arch, tuple(args.size), args.batch, args.dtype,
                                         args.steps, rounds=args.rounds, trace=trace, **kwargs)
            split = results[name].pop('split')
            for reads, r in results[name].items():
                rows.append([name, reads, f"{r['step_ms']:.1f}", f"{r['host_ms']:.1f}",
                             f"{r['device_ms']:.1f}", f"{r['waits']:g}"])
            splits.append([name, f"{split['first_call_s']:.1f}", f"{split['kernels']:.0f}",
                           f"{split['profiled_ms']:.1f}", f"{split['ops_ms']:.1f}",
                           f"{split['launch_ms']:.1f}", f"{split['python_ms']:.1f}"])
            results[name]['split'] = split
    print(f'{args.size[0]}x{args.size[1]}, batch {args.batch}, {args.dtype}, training step '
          f'(forward + backward), median of {args.rounds} interleaved rounds of {args.steps} '
          'steps; ' + ', '.join(f'{k}: {v}' for k, v in environment('cuda').items()))
    print('\n'.join(markdown_table(['arch', 'device reads', 'step ms', 'host ms', 'device ms',
                                    'waits a step'], rows)))
    print('\nWhere the host\'s time goes (3 profiled steps, as built; ms per step):')
    print('\n'.join(markdown_table(['arch', 'first call s', 'kernels a step', 'profiled step',
                                    'in operators', 'of which launches', 'Python around them'],
                                   splits)))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)


if __name__ == '__main__':
    main()
