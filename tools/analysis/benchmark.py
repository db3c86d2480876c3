"""Latency, throughput and peak memory of backbones (by arch) or a config's whole model over input
sizes, fp32/bf16/fp16, inference and training passes, each in a fresh process; optionally against
timm's own forward (and the GEMM floor, the roofline, torch.compile), interleaved in one process;
where the time goes (torch.profiler). Writes benchmark.md, benchmark.csv, compare.csv and
benchmark.png into --out-dir, prints torch.utils.benchmark's Compare tables and the command that
reproduces the run.
How each number is taken: docs/benchmark.md.

  python tools/analysis/benchmark.py --arch small_12_p8 small_12_p16 --sizes 512 1024
  python tools/analysis/benchmark.py --arch xxs24 --sizes 224 --compare-timm --compare-floor --compare-only
  python tools/analysis/benchmark.py --quick                   # tiny model and sizes, one repeat
"""
import argparse
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402

QUICK = dict(arch=['nano_12_p16'], sizes=['64', '96x128'], warmup=0, repeats=1)
DEFAULTS = dict(arch=['small_12_p16'], sizes=['512', '1024'], warmup=2, repeats=5)
WITH_COMPARE = ('compare_floor', 'compile', 'roofline', 'compare_only')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--arch', nargs='+', help='backbone archs, short or timm names (default: '
                                             'small_12_p16 unless --config; --quick: nano_12_p16)')
    p.add_argument('--config', help='an mmseg/mmdet config: its whole model (random weights)')
    p.add_argument('--sizes', nargs='+', help='input sizes, N or HxW (default: 512 1024)')
    p.add_argument('--batch', type=int, default=1, help='images per call (default: 1)')
    p.add_argument('--dtypes', nargs='+', choices=['fp32', 'bf16', 'fp16'],
                   help='autocast dtypes (default: fp32 bf16; --passes step: fp32)')
    p.add_argument('--passes', nargs='+', choices=['fwd', 'train', 'step'],
                   default=['fwd', 'train'], help="'fwd' inference, 'train' forward + backward, "
                   "'step' (--config) model.train_step with its optimizer (default: fwd train)")
    p.add_argument('--device', default='auto', choices=['auto', 'cpu', 'cuda'])
    p.add_argument('--threads', type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument('--warmup', type=int, help='untimed calls, the memory-measuring first call '
                                              'included (default: 2; --quick: 0)')
    p.add_argument('--repeats', type=int, help='timed calls (default: 5; --quick: 1)')
    p.add_argument('--tensor-peak', action='store_true',
                   help="also the first call's tensor peak from torch.profiler")
    p.add_argument('--mem-limit-gb', type=float, default=0.0,
                   help='address-space cap (GiB) of each measuring process on CPU; 0: none')
    p.add_argument('--compare-timm', action='store_true',
                   help="also time each --arch against timm's forward_intermediates + the same "
                        'adapter on the same weights, interleaved: ratios, memory, output error')
    p.add_argument('--compare-floor', action='store_true',
                   help="with --compare-timm: also the standard model's block GEMMs as torch.mm")
    p.add_argument('--profile', action='store_true',
                   help="also one call of each measurement under torch.profiler: its operators' "
                        'table (self time) and a Chrome trace into --out-dir/profiles')
    p.add_argument('--compile', action='store_true',
                   help='with --compare-timm: also ours and timm under torch.compile')
    p.add_argument('--roofline', action='store_true',
                   help="with --compare-timm: also each eager pass against this device's roofline")
    p.add_argument('--compare-only', action='store_true',
                   help='with --compare-timm: only the comparison')
    p.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                   help='config overrides, or with --arch backbone arguments (gram_xca=True)')
    p.add_argument('--timeout', type=float, help='seconds per measurement (default: none)')
    p.add_argument('--out-dir', default='work_dirs/benchmark')
    p.add_argument('--quick', action='store_true',
                   help='smoke test: nano_12_p16, 64 and 96x128, no warm-up, one repeat')
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    args.arch = args.arch or ([] if args.config else preset['arch'])
    args.dtypes = args.dtypes or (['fp32'] if 'step' in args.passes else ['fp32', 'bf16'])
    if 'step' in args.passes and (args.arch or args.dtypes != ['fp32']):
        p.error("--passes step is a config's model.train_step in its own precision: give "
                '--config without --arch, and --dtypes fp32')
    for key in ('sizes', 'warmup', 'repeats'):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    if args.compare_timm and not args.arch:
        p.error('--compare-timm measures backbones: give --arch')
    if args.profile and args.compare_only:
        p.error('--profile profiles the measurements, which --compare-only leaves out')
    for flag in WITH_COMPARE:
        if getattr(args, flag) and not args.compare_timm:
            p.error(f'--{flag.replace("_", "-")} goes with --compare-timm')
    if args.batch < 1 or args.repeats < 0 or args.warmup < 0:
        p.error('--batch must be >= 1, --repeats and --warmup >= 0')
    return args


def command_line(args) -> str:
    """The command that reproduces this run, every setting spelled out (not --quick)."""
    parts = ['python', 'tools/analysis/benchmark.py']
    for key, value in vars(args).items():
        flag = '--' + key.replace('_', '-')
        if key == 'quick' or value is None or value is False or value == []:
            continue
        if value is True:
            parts.append(flag)
        elif key == 'cfg_options':
            parts += [flag, *(f'{k}={v}' for k, v in value.items())]
        else:
            parts += [flag, *map(str, value if isinstance(value, list) else [value])]
    return shlex.join(parts)


def main(argv=None):
    args = parse_args(argv)
    import torch
    from torch.utils.benchmark import Compare

    from deepvit_tools import benchmark as bm
    if args.device == 'auto':
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.device == 'cpu':  # as tools/train.py: tcmalloc when the system has it
        from deepvit_mm.engine import preload_tcmalloc
        preload_tcmalloc(__file__)
    args.threads = args.threads or torch.get_num_threads()
    sizes = [bm.parse_size(s) for s in args.sizes]
    command = command_line(args)
    print(f'reproduce with: {command}', flush=True)
    options = dict(args.cfg_options or {})
    settings = dict(batch=args.batch, device=args.device, threads=args.threads,
                    warmup=args.warmup, repeats=args.repeats)
    profile = os.path.join(args.out_dir, 'profiles') if args.profile else ''
    models = [] if args.compare_only else args.arch + ([args.config] if args.config else [])
    rows = bm.measure_grid(models, sizes, args.dtypes, args.passes, timeout=args.timeout,
                           log=print, cfg_options=options, tensor_peak=args.tensor_peak,
                           mem_limit_gib=args.mem_limit_gb if args.device == 'cpu' else 0.0,
                           profile=profile, **settings)
    comparisons = []
    if args.compare_timm:
        comparisons = bm.compare_grid(
            args.arch, sizes, args.dtypes, args.passes, compile=args.compile,
            baselines=('timm', 'floor') if args.compare_floor else ('timm',),
            roofline=args.roofline, backbone_kwargs=options, **dict(settings,
                                                                    repeats=max(args.repeats, 1)))
    paths = bm.write_report(args.out_dir, rows, comparisons, command, bm.environment(args.device))
    lines = []
    for r in rows:
        if r.get('profile_table'):
            lines += ['', f"### Operators by self time: {r['label']}, {bm.size_str(r['size'])}, "
                      f"{r['dtype']}, {r['mode']} (trace: {r['profile_trace']})", '', '```',
                      r['profile_table'].rstrip(), '```']
    with open(paths['md'], 'a') as f:
        f.write('\n'.join(lines) + '\n')
    measured = [r['measurement'] for r in rows if r.get('measurement')]
    measured += [m for c in comparisons for m in c['measurements']]
    if measured:
        table = Compare(measured)
        table.trim_significant_figures()
        table.print()
    print('\n'.join(lines))
    print('wrote ' + ', '.join(paths.values()) + f'\nreproduce with: {command}')
    if any(r.get('error') for r in rows):
        sys.exit('some measurements failed: ' + '; '.join(r['error'] for r in rows
                                                            if r.get('error')))


if __name__ == '__main__':
    main()
