"""CPU inference speed: ONNX Runtime against PyTorch eager (ours), side by side in one run.

For each config (and with --parts, its backbone and/or whole model) the model is exported once
with --dynamic (random weights: speed does not depend on them), then at each size PyTorch eager
and ONNX Runtime run the same input, --warmup untimed calls each and --repeats timed calls each,
interleaved call by call (deepvit_mm/benchmark's timing); medians are printed as a markdown table
with the outputs' largest relative difference, followed by the command line.

Example (docs/deployment.md):
  OMP_NUM_THREADS=1 python tools/analysis/benchmark_onnx.py configs/sem_fpn_xcit_s12_8_80k_ade20k.py \\
      configs/sem_fpn_xcit_s12_16_80k_ade20k.py --parts backbone segmentor --sizes 512 800x1344
"""
import argparse
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('configs', nargs='+', help='mmdet/mmseg configs with a deepvit_mm backbone')
    p.add_argument('--parts', nargs='+', choices=['backbone', 'model'], default=['backbone', 'model'],
                   help="'backbone' (its pyramid maps) and/or 'model' (the whole segmentor or "
                        'detector). Default: both')
    p.add_argument('--sizes', nargs='+', default=['512', '800x1344'],
                   help='input sizes, N or HxW, multiples of 32 (default: 512 800x1344)')
    p.add_argument('--warmup', type=int, default=1, help='untimed calls of each (default: 1)')
    p.add_argument('--repeats', type=int, default=3, help='timed calls of each (default: 3)')
    p.add_argument('--threads', type=int, default=1,
                   help="threads of PyTorch and of ONNX Runtime (default: 1)")
    p.add_argument('--fixed', action='store_true', help='export once per size instead of one '
                                                        '--dynamic file')
    p.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import deepvit_mm  # noqa: F401  (registers the backbones)
    from deepvit_tools.benchmark import environment, fmt, markdown_table, parse_size, size_str
    from deepvit_tools.benchmark.onnx_speed import compare_onnxruntime
    sizes = [parse_size(s) for s in args.sizes]
    rows = []
    for config in args.configs:
        for part in args.parts:
            rows += compare_onnxruntime(config, sizes, backbone_only=part == 'backbone',
                                        cfg_options=args.cfg_options, warmup=args.warmup,
                                        repeats=args.repeats, threads=args.threads,
                                        dynamic=not args.fixed)
            r = rows[-1]
            print(f'[{os.path.basename(config)} {r["part"]}] done', flush=True)
    table = markdown_table(
        ['config', 'part', 'arch', 'input', 'PyTorch eager (ms)', 'ONNX Runtime (ms)',
         'PyTorch / ORT', 'max rel. error'],
        [[os.path.splitext(os.path.basename(r['config']))[0], r['part'], r['arch'],
          size_str(r['size']), fmt(r['pytorch_ms'], 0), fmt(r['onnxruntime_ms'], 0),
          fmt(r['speedup'], 2), '-' if r['max_rel_err'] is None else f'{r["max_rel_err"]:.1e}']
         for r in rows])
    print('\n'.join(table))
    env = environment('cpu')
    print(f'\nmedians of {args.repeats} interleaved calls after {args.warmup} warm-up; '
          f'{args.threads} thread(s) each; ' + ', '.join(f'{k} {v}' for k, v in env.items()))
    print('all calls (ms): ' + '; '.join(
        f'{os.path.basename(r["config"])} {r["part"]} {size_str(r["size"])}: PyTorch '
        + ' '.join(f'{t:.0f}' for t in r['pytorch_all_ms']) + ', ORT '
        + ' '.join(f'{t:.0f}' for t in r['onnxruntime_all_ms']) for r in rows))
    print('command: ' + ' '.join(shlex.quote(a) for a in
                                 ['python', 'tools/analysis/benchmark_onnx.py', *sys.argv[1:]]))


if __name__ == '__main__':
    main()
