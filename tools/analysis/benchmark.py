"""Latency, throughput and peak memory of XCiT or CaiT backbones or whole models (fp32 / bf16,
inference and training passes) over input sizes; optionally against timm's own forward (and the
GEMM floor), and the metrics (mIoU) of a checkpoint. Writes benchmark.md (tables), benchmark.csv
(one row per measurement; compare.csv with --compare-timm) and benchmark.png (latency and peak
memory vs input resolution) into --out-dir and prints the command line that reproduces them,
every setting spelled out.

Examples:
  python tools/analysis/benchmark.py --arch small_12_p8 small_12_p16 --sizes 512 1024
  python tools/analysis/benchmark.py --arch small_12_p8 --sizes 800x1344 --compare-timm
  python tools/analysis/benchmark.py --arch xxs24 --sizes 224 --compare-timm --compare-floor --compare-only
  python tools/analysis/benchmark.py --config configs/upernet_xcit_s12_8_160k_ade20k.py --sizes 512 \\
      --checkpoint upernet_xcit_small_12_p8.pth       # + mIoU on ADE20k val (single-scale)
  python tools/analysis/benchmark.py --quick                   # tiny model and sizes, one repeat

How it measures (docs/benchmark.md; the harness is deepvit_tools/benchmark/): latency is the median
of --repeats timed calls after --warmup calls (the first call measures memory and counts as a
warm-up call; with --warmup 0 it is the first timed call); throughput = batch / latency. Every
measurement runs in a fresh process (CPU: forked from a clean fork server; CUDA: spawned); its
first call gives the peak memory: on CPU the peak resident set minus the resident set before the
call (Linux: kernel high-water mark reset just before it), on CUDA torch.cuda.max_memory_allocated
minus the memory allocated before it.
'fwd' = inference (eval, no autograd), 'train' = forward + backward (no optimizer step);
'bf16' ('fp16') = torch.autocast(bfloat16 (float16)) on CPU or CUDA. Also reported: the first
(cold) call's time and the CPU time of the process per call. On a shared machine, note the load
average the report records: other processes slow every wall-clock number down; with --threads 1
the CPU time stays close to what an idle core takes (with more threads it also counts threads
spinning while they wait for each other).
"""
import argparse
import functools
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mmengine.config import DictAction  # noqa: E402

QUICK = dict(arch=['nano_12_p16'], sizes=['64', '96x128'], warmup=0, repeats=1)
DEFAULTS = dict(arch=['small_12_p16'], sizes=['512', '1024'], warmup=2, repeats=5)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--arch', nargs='+', metavar='ARCH',
                   help='backbones (trunk + ColumnarPyramid): XCiT or CaiT archs, short or timm '
                        'names, e.g. small_12_p8 xcit_small_12_p16_224 xxs24 (default: '
                        f'{DEFAULTS["arch"][0]} unless --config is given; --quick: nano_12_p16)')
    p.add_argument('--config', help='an mmseg/mmdet config: benchmark its whole model (random '
                                    'weights; SyncBN -> BN); with --checkpoint also its mIoU')
    p.add_argument('--sizes', nargs='+', metavar='SIZE',
                   help='input sizes, N (square) or HxW (default: 512 1024; --quick: 64 96x128)')
    p.add_argument('--batch', type=int, default=1, help='images per call (default: 1)')
    p.add_argument('--dtypes', nargs='+', choices=['fp32', 'bf16', 'fp16'],
                   default=['fp32', 'bf16'],
                   help='fp32, bf16 and/or fp16 autocast (default: fp32 bf16)')
    p.add_argument('--passes', nargs='+', choices=['fwd', 'train'], default=['fwd', 'train'],
                   help="'fwd' inference and/or 'train' forward + backward (default: both)")
    p.add_argument('--device', default='auto', choices=['auto', 'cpu', 'cuda'],
                   help='auto: cuda when available (default: auto)')
    p.add_argument('--threads', type=int, default=0,
                   help="torch threads in each measurement (default: 0 = torch's default)")
    p.add_argument('--warmup', type=int, help='untimed calls before timing, the memory-measuring '
                                              'first call included (default: 2; --quick: 0)')
    p.add_argument('--repeats', type=int, help='timed calls; the median is reported '
                                               '(default: 5; --quick: 1)')
    p.add_argument('--compare-timm', action='store_true',
                   help="also time each --arch against timm's own forward_intermediates(x, "
                        'indices=taps, intermediates_only=True) on the same trunk weights + the '
                        'same adapter, interleaved in one process: ours/timm ratios for eval fwd '
                        'and the train step in each of --dtypes (as --passes asks), '
                        'peak memory of both, and the max relative error between their outputs')
    p.add_argument('--compare-floor', action='store_true',
                   help="with --compare-timm: also time the standard model's block GEMMs as "
                        'plain torch.mm on the same shapes, interleaved with the models '
                        '(the "ours / floor" columns)')
    p.add_argument('--breakdown', action='store_true',
                   help='with --arch, on CPU: also profile one fp32 call of each pass of each '
                        'arch and size by kind of work (matrix products, convolutions, GELU, '
                        'normalisation, copies...), each against its own floor measured in the '
                        'same process (deepvit_tools/benchmark/breakdown.py)')
    p.add_argument('--compile', action='store_true',
                   help='with --compare-timm: also time ours and timm under torch.compile '
                        '(default mode), interleaved with the eager ones: compiled / eager, the '
                        'first call (compilation) of each, peak memory, error against its eager model')
    p.add_argument('--roofline', action='store_true',
                   help="with --compare-timm: also count each pass's FLOPs and bytes operator "
                        "by operator and hold its time against this device's roofline (GEMM "
                        'rate and copy bandwidth measured in the same run; '
                        'deepvit_tools/benchmark/roofline.py)')
    p.add_argument('--compare-only', action='store_true',
                   help='with --compare-timm: only the comparison, not the per-model table')
    p.add_argument('--checkpoint', help='with --config: evaluate this checkpoint on the '
                                        "config's test set as tools/test.py does (ADE20k val, "
                                        'single-scale: mIoU; COCO: mAP) and report its metrics')
    p.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                   help='override --config entries, e.g. test_dataloader.dataset.data_root=DIR; '
                        'with --arch: backbone arguments, e.g. gram_xca=True')
    p.add_argument('--timeout', type=float, default=None,
                   help='give up on one measurement after this many seconds (default: none)')
    p.add_argument('--out-dir', default='work_dirs/benchmark',
                   help='where benchmark.md/.csv/.png go (default: work_dirs/benchmark)')
    p.add_argument('--quick', action='store_true',
                   help='tiny arch (nano_12_p16), tiny sizes, no warm-up, one repeat: a smoke '
                        'test; explicit options still win')
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    if args.arch is None and args.config is None:
        args.arch = preset['arch']
    args.arch = args.arch or []
    for key in ('sizes', 'warmup', 'repeats'):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    if args.checkpoint and not args.config:
        p.error('--checkpoint needs --config (the model and test set it was trained for)')
    if args.compare_timm and not args.arch:
        p.error('--compare-timm compares backbones: give --arch')
    if args.compare_only and not args.compare_timm:
        p.error('--compare-only goes with --compare-timm')
    for flag in ('compare_floor', 'compile', 'roofline'):
        if getattr(args, flag) and not args.compare_timm:
            p.error(f'--{flag.replace("_", "-")} goes with --compare-timm')
    if args.breakdown and not args.arch:
        p.error('--breakdown profiles backbones: give --arch')
    if args.batch < 1 or args.repeats < 0 or args.warmup < 0:
        p.error('--batch must be >= 1, --repeats and --warmup >= 0')
    return args


def command_line(args) -> str:
    """The command that reproduces this run, with every setting spelled out."""
    parts = ['python', 'tools/analysis/benchmark.py']
    if args.arch:
        parts += ['--arch', *args.arch]
    if args.config:
        parts += ['--config', args.config]
    parts += ['--sizes', *args.sizes, '--batch', str(args.batch), '--dtypes', *args.dtypes,
              '--passes', *args.passes, '--device', args.device, '--threads', str(args.threads),
              '--warmup', str(args.warmup), '--repeats', str(args.repeats)]
    if args.compare_timm:
        parts.append('--compare-timm')
    if args.compare_floor:
        parts.append('--compare-floor')
    for flag in ('compile', 'roofline', 'compare_only'):
        if getattr(args, flag):
            parts.append(f'--{flag.replace("_", "-")}')
    if args.breakdown:
        parts.append('--breakdown')
    if args.checkpoint:
        parts += ['--checkpoint', args.checkpoint]
    if args.cfg_options:
        parts += ['--cfg-options', *(f'{k}={v}' for k, v in args.cfg_options.items())]
    if args.timeout:
        parts += ['--timeout', str(args.timeout)]
    parts += ['--out-dir', args.out_dir]
    return shlex.join(parts)


def main(argv=None):
    args = parse_args(argv)
    import torch

    from deepvit_tools import benchmark as bm
    if args.device == 'auto':
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.device == 'cpu':  # as tools/train.py: tcmalloc when the system has it
        from deepvit_mm.engine import preload_tcmalloc
        preload_tcmalloc(__file__)
    if args.threads == 0:
        args.threads = torch.get_num_threads()
    sizes = [bm.parse_size(s) for s in args.sizes]
    command = command_line(args)
    print(f'reproduce with: {command}', flush=True)
    env = bm.environment(args.device)
    log = functools.partial(print, flush=True)
    settings = dict(batch=args.batch, device=args.device, threads=args.threads,
                    warmup=args.warmup, repeats=args.repeats)
    models = [] if args.compare_only else args.arch + ([args.config] if args.config else [])
    rows = bm.measure_grid(models, sizes, args.dtypes, args.passes, timeout=args.timeout, log=log,
                           cfg_options=dict(args.cfg_options or {}), **settings)
    comparisons = []
    if args.compare_timm:
        settings['repeats'] = max(args.repeats, 1)
        comparisons = bm.compare_grid(
            args.arch, sizes, args.dtypes, args.passes,
            baselines=('timm', 'floor') if args.compare_floor else ('timm',), log=log,
            compile=args.compile, roofline=args.roofline,
            backbone_kwargs=dict(args.cfg_options or {}), **settings)
    metrics = None
    if args.checkpoint:
        metrics = bm.evaluate_checkpoint(args.config, args.checkpoint,
                                         os.path.join(args.out_dir, 'test'), args.cfg_options)
    paths = bm.write_report(args.out_dir, rows, comparisons, metrics, command, env)
    if args.breakdown:
        if args.device != 'cpu':
            sys.exit('--breakdown profiles on CPU: add --device cpu')
        lines = []
        for arch in args.arch:
            for size in sizes:
                for mode in args.passes:
                    log(f'breakdown: {arch} {bm.size_str(size)} {mode}')
                    res = bm.run_isolated(bm.op_breakdown, arch, size, mode,
                                          max(args.repeats, 1), timeout=args.timeout,
                                          **dict(args.cfg_options or {}))
                    lines += ['', f'### Where the time goes: {arch}, {bm.size_str(size)}, '
                              f"{'inference' if mode == 'fwd' else 'training step'}, fp32, "
                              f"{res['threads']} threads", '', *bm.breakdown_markdown(res)]
        with open(paths['md'], 'a') as f:
            f.write('\n'.join(lines) + '\n')
    with open(paths['md']) as f:
        print(f.read())
    print('wrote ' + ', '.join(paths[k] for k in ('md', 'csv', 'compare_csv', 'png') if k in paths))
    print(f'reproduce with: {command}')
    if any(r.get('error') for r in rows):
        sys.exit('some measurements failed (see the table)')


if __name__ == '__main__':
    main()
