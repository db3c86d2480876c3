"""Peak memory and time of one forward + backward of a CaiT backbone, global vs windowed attention,
with and without gradient checkpointing; each variant in a fresh process (docs/benchmark.md says
how each number is taken, docs/cait.md what they were). --out-indices and --global-blocks prune
the trunk, for per-block costs when the full depth does not fit.

    python tools/analysis/benchmark_memory.py --arch s24 --size 800 1344
"""
import argparse
import json
import os
import sys
from typing import List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from deepvit_tools.benchmark.report import fmt, markdown_table  # noqa: E402

VARIANTS = ('global', 'global+cp', 'window', 'window+cp')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', default='s24', help='CaiT arch (default: s24)')
    p.add_argument('--size', nargs=2, type=int, default=(800, 1344), metavar=('H', 'W'))
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--variants', nargs='+', choices=VARIANTS, default=list(VARIANTS),
                   help='global / windowed attention, with or without gradient checkpointing')
    p.add_argument('--window-size', type=int, default=14, help='patches per window side')
    p.add_argument('--out-indices', nargs=4, type=int, help="taps (default: the arch's own)")
    p.add_argument('--global-blocks', nargs='+', type=int,
                   help='blocks kept global in the windowed variants (default: the taps)')
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--threads', type=int, help="torch CPU threads (default: torch's)")
    p.add_argument('--warmup', type=int, default=1,
                   help='untimed passes, the first (profiled) one included; 0: it is timed')
    p.add_argument('--repeat', type=int, default=1, help='timed passes (the median is reported)')
    p.add_argument('--mem-limit-gb', type=float, default=16.0,
                   help='CPU address-space cap per variant (~3 GiB above the peak RSS); 0: none')
    p.add_argument('--timeout', type=float, help='seconds per variant (default: none)')
    p.add_argument('--json', help='also write the results to this file')
    return p.parse_args(argv)


def variant_case(args, variant: str):
    """The harness's Case for one variant: a CaiT training pass, drop path off."""
    from deepvit_tools.benchmark import Case
    windowed = variant.startswith('window')
    backbone = dict(window_size=args.window_size if windowed else 0,
                    with_cp=variant.endswith('+cp'), drop_path_rate=0.0)
    if windowed and args.global_blocks is not None:
        backbone['global_blocks'] = args.global_blocks
    if args.out_indices is not None:
        backbone['out_indices'] = args.out_indices
    return Case(args.arch, tuple(args.size), args.batch, 'fp32', 'train', args.device,
                threads=args.threads or 0, warmup=args.warmup, repeats=args.repeat,
                cfg_options=backbone, tensor_peak=True,
                mem_limit_gib=args.mem_limit_gb if args.device == 'cpu' else 0.0)


def _gib(mib: Optional[float]) -> Optional[float]:
    return None if mib is None else round(mib / 1024, 2)


def _s(ms: Optional[float]) -> Optional[float]:
    return None if ms is None else round(ms / 1e3, 2)


def cait_variant_row(variant: str, result: dict) -> dict:
    """One row of the table (and ``--json``) from ``measure``'s result: GiB, seconds, status."""
    info = result.get('info') or {}
    row = dict(variant=variant, arch=result['model'], size=list(result['size']),
               batch=result['batch'], device=result['device'], threads=result.get('threads'),
               **{k: info.get(k) for k in ('window_size', 'global_blocks', 'blocks', 'with_cp',
                                           'tokens')})
    if result.get('error'):
        return dict(row, status=f'failed: {result["error"]}')
    return dict(row, status='ok', base_gb=_gib(result['mem_before_mib']),
                peak_gb=_gib(result['mem_peak_mib']), added_gb=_gib(result['peak_mem_mib']),
                tensor_peak_gb=_gib(result.get('tensor_peak_mib')),
                seconds=_s(result['latency_ms']), cpu_seconds=_s(result['cpu_ms']),
                all_seconds=[_s(t) for t in result.get('latencies_ms') or []])


def cait_variants_markdown(rows: List[dict], arch: str, batch: int, size: Sequence[int],
                           device: str) -> str:
    """The table: one line per attention variant."""
    unit = 'CUDA max allocated' if device == 'cuda' else 'peak RSS'
    threads = next((r.get('threads') for r in rows if r.get('threads')), None)
    title = (f'CaiT-{arch}, {batch}x3x{size[0]}x{size[1]}, forward + backward, {device}'
             + (f', {threads} threads' if device == 'cpu' and threads else ''))
    body = []
    for r in rows:
        gb = r.get('global_blocks')
        gb = 'all' if gb and len(gb) == r.get('blocks') else ', '.join(map(str, gb or []))
        body.append([r['variant'], gb, r.get('blocks', '')] + [
            fmt(r.get(k), 2) for k in ('peak_gb', 'base_gb', 'added_gb', 'tensor_peak_gb',
                                       'seconds', 'cpu_seconds')] + [r['status']])
    return '\n'.join([title] + markdown_table(
        ['variant', 'global blocks', 'blocks', f'{unit} (GiB)', 'model + input (GiB)',
         'added (GiB)', 'tensor peak (GiB)', 'time (s)', 'CPU time (s)', 'status'], body))


def main(argv=None):
    args = parse_args(argv)
    from deepvit_tools.benchmark import measure_isolated
    rows = []
    for v in args.variants:
        rows.append(cait_variant_row(v, measure_isolated(variant_case(args, v),
                                                         timeout=args.timeout)))
        print(json.dumps(rows[-1]), file=sys.stderr)
    print('\n' + cait_variants_markdown(rows, args.arch, args.batch, tuple(args.size), args.device))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)


if __name__ == '__main__':
    main()
