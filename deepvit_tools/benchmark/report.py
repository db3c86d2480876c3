"""Reports: markdown tables, CSV files and a plot of cost against input size.

``write_report`` writes what ``tools/analysis/benchmark.py`` measured: ``benchmark.md`` (every table, the
command that reproduces it and the environment), ``benchmark.csv`` (one row per measurement),
``compare.csv`` (one row per compared model, size and pass) and ``benchmark.png``.
``markdown_table`` is the one table writer every tool's output goes through.
"""
import csv
import math
import os
import platform
from typing import Any, Dict, List, Optional, Sequence

import torch

from deepvit_mm.engine.allocator import cpu_allocator

from .compare import eager_name, err_key
from .measure import COMPARE_MODES, DTYPES

__all__ = ['environment', 'fmt', 'size_str', 'markdown_table', 'benchmark_markdown',
           'write_report', 'ROW_FIELDS',
           'COMPARE_FIELDS']

# benchmark.csv's columns, in order
ROW_FIELDS = ['label', 'model', 'size', 'batch', 'dtype', 'mode', 'impl', 'device', 'threads',
              'warmup', 'repeats', 'latency_ms', 'latency_min_ms', 'throughput', 'cpu_ms',
              'peak_mem_mib', 'mem_method', 'first_call_ms', 'error']
# compare.csv's columns before the ones of baselines other than timm (ratio_floor, ...)
COMPARE_FIELDS = ['label', 'size', 'batch', 'pass', 'ours_ms', 'timm_ms', 'ratio', 'ours_mem_mib',
                  'timm_mem_mib', 'max_rel_err_fp32', 'max_rel_err_bf16',
                  'max_rel_err_fp16']


def environment(device: str) -> Dict[str, str]:
    """What the numbers depend on: versions, CPU/GPU, threads, the malloc, load."""
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next((ln.split(':', 1)[1].strip() for ln in f if ln.startswith('model name')), cpu)
    except OSError:
        pass
    env = dict(torch=torch.__version__, python=platform.python_version(), cpu=cpu,
               cpu_count=str(os.cpu_count()), threads=str(torch.get_num_threads()),
               malloc=cpu_allocator())
    if hasattr(os, 'getloadavg'):
        env['load_avg_1_5_15min'] = ' '.join(f'{v:.1f}' for v in os.getloadavg())
    if str(device).startswith('cuda') and torch.cuda.is_available():
        env['gpu'] = torch.cuda.get_device_name()
    return env


def fmt(v: Any, digits: int = 1) -> str:
    """A number with ``digits`` decimals; ``-`` for None or NaN; anything else as ``str``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return '-'
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f'{v:.{digits}f}'
    return str(v)


def size_str(size: Sequence[int]) -> str:
    """``(800, 1344)`` -> ``'800x1344'``."""
    return f'{size[0]}x{size[1]}'


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> List[str]:
    """A markdown table's lines; cells are written with ``str``."""
    return (['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
            + ['| ' + ' | '.join(str(c) for c in r) + ' |' for r in rows])


def _compare_keys(comparisons: List[dict]) -> List[str]:
    """The ``{pass}_{dtype}`` modes that some comparison timed, in ``COMPARE_MODES``' order."""
    keys = [f'{mode}_{dtype}' for mode, dtype in COMPARE_MODES]
    return [k for k in keys if any(k in c for c in comparisons)]


def _other_baselines(comparisons: List[dict]) -> List[str]:
    names = []
    for c in comparisons:
        names += [b for b in c.get('baselines', ['timm']) if b != 'timm' and b not in names]
    return names


def _measurement_rows(rows: List[dict]) -> List[str]:
    body = []
    for r in rows:
        head = [r['label'], size_str(r['size']), r['batch'], r['dtype'], r['mode']]
        if r.get('error'):
            body.append(head + [f'failed: {r["error"]}'] + [''] * 5)
            continue
        body.append(head + [fmt(r['latency_ms']), fmt(r['latency_min_ms']),
                            fmt(r['throughput'], 2), fmt(r.get('cpu_ms')),
                            fmt(r['peak_mem_mib'], 0), fmt(r.get('first_call_ms'))])
    lines = markdown_table(['model', 'input', 'batch', 'dtype', 'pass', 'latency ms (median)',
                            'min ms', 'throughput img/s', 'CPU ms', 'peak mem MiB',
                            'first call ms'], body)
    methods = sorted({r['mem_method'] for r in rows if r.get('mem_method')})
    return lines + ['', 'fwd: inference (eval, no autograd); train: forward + backward. bf16, fp16: '
                    'autocast. CPU ms: CPU time of the process per call, all threads summed. Peak '
                    'memory: ' + '; '.join(methods) + ' (growth over the built model and its '
                    'input).', '']


def _comparison_rows(comparisons: List[dict]) -> List[str]:
    others = _other_baselines(comparisons)
    keys = _compare_keys(comparisons)
    names = [k.replace('_', ' ') for k in keys]
    err_dtypes = [d for d in DTYPES[1:] if any(f'{d}_max_rel_err' in c for c in comparisons)]
    header = ['model', 'input', 'batch']
    for n in names:
        header += [f'{n} ours / timm ms', 'ratio'] + [f'{n} {b} ms' for b in others] \
            + [f'ours / {b}' for b in others]
    header += [f'peak mem ours / timm MiB ({", ".join(names)})',
               'max rel err fp32' + (f' ({", ".join(err_dtypes)})' if err_dtypes else '')]
    body = []
    for c in comparisons:
        cells, mems = [c['label'], size_str(c['size']), c['batch']], []
        for key in keys:
            v = c.get(key)
            if v is None:  # not timed for this one
                cells += ['–'] * (2 + 2 * len(others))
                mems.append('–')
                continue
            cells += [f'{fmt(v.get("ours_ms"))} / {fmt(v.get("timm_ms"))}',
                      f'{v["ratio"]:.3f}' if 'ratio' in v else '–']
            cells += [fmt(v.get(f'{b}_ms')) for b in others]
            cells += [f'{v[f"ratio_{b}"]:.3f}' if f'ratio_{b}' in v else '–' for b in others]
            mems.append(f'{fmt(v.get("ours_mem_mib"), 0)} / {fmt(v.get("timm_mem_mib"), 0)}')
        err = f'{c["max_rel_err"]:.2e}' if 'max_rel_err' in c else '–'
        errs = [f'{c[f"{d}_max_rel_err"]:.2e}' if f'{d}_max_rel_err' in c else '–'
                for d in err_dtypes]
        body.append(cells + ['; '.join(mems), err + (f' ({", ".join(errs)})' if errs else '')])
    note = ('ratio = ours / timm (median latencies, interleaved in one process); '
            'max rel err = max over levels of max|ours - timm| / max|timm|.')
    if others:
        note += (' ' + ', '.join(f'ours / {b}' for b in others) + ': against the standard '
                 "model's block GEMMs as plain torch.mm on the same shapes, in the same run.")
    return ['## Ours vs timm (`forward_intermediates` + the same adapter, same weights)', '',
            *markdown_table(header, body), '', note, '']


def _impl_rows(comparisons: List[dict]) -> List[str]:
    """Per model and mode, each implementation timed (eager and compiled): its time, first
    call, peak memory, compiled / eager and time / roofline, where ``compare`` measured them."""
    done = [c for c in comparisons if c.get('compiled') or c.get('rates')]
    if not done:
        return []
    body = []
    for c in done:
        for key in _compare_keys([c]):
            v = c[key]
            # the models timed in this mode (``{impl}_ms``) that were compiled or held against
            # the roofline
            impls = [k[:-3] for k in v if k.endswith('_ms') and (
                f'{k[:-3]}_first_ms' in v or f'{k[:-3]}_vs_roofline' in v)]
            for impl in impls:
                base = eager_name(impl)
                roof = v.get(f'{base}_roofline_ms')
                err = c.get(err_key(impl, key.split('_')[1])) \
                    if impl != base and key.startswith('fwd') else None  # checked in inference
                body.append([c['label'], size_str(c['size']), c['batch'], key.replace('_', ' '),
                             impl.replace('_', ' '), fmt(v.get(f'{impl}_ms'), 2),
                             fmt(v.get(f'{impl}_first_ms'), 0),
                             fmt(v.get(f'{impl}_mem_mib'), 0),
                             f'{v[f"{impl}_vs_eager"]:.3f}' if f'{impl}_vs_eager' in v else '–',
                             (f'{fmt(roof, 2)} ({fmt(v.get(f"{base}_compute_ms"), 2)} / '
                              f'{fmt(v.get(f"{base}_memory_ms"), 2)})') if roof else '–',
                             (f'{fmt(v.get(f"{base}_gflop"), 1)} / '
                              f'{fmt(v.get(f"{base}_gbyte"), 2)}') if roof else '–',
                             f'{v[f"{impl}_vs_roofline"]:.2f}' if f'{impl}_vs_roofline' in v
                             else '–', f'{err:.2e}' if err is not None else '–'])
    header = ['model', 'input', 'batch', 'pass', 'implementation', 'ms (median)',
              'first call ms', 'peak MiB', 'compiled / eager',
              'roofline ms (compute / memory)', 'GFLOP / GB', 'time / roofline',
              'max rel err vs eager']
    rates = [f"{c['label']} {size_str(c['size'])}: " + ', '.join(
        f'{k.replace("_tflops", "")} GEMM {v:.1f} TFLOP/s' if k.endswith('_tflops')
        else f'copy {v:.2f} TB/s' for k, v in c['rates'].items()) for c in done if c.get('rates')]
    note = ('compiled: torch.compile (default mode); first call: the first call in that pass and '
            'dtype (a compiled model compiles then). Roofline: the eager pass\'s operators, each '
            'at the larger of its FLOPs at the GEMM rate of its dtype and its bytes read and '
            'written at the copy bandwidth, summed (compute: all FLOPs at the GEMM rate; memory: '
            'all bytes at the copy bandwidth); a compiled model is held against its eager '
            "model's roofline, which fusion can go below. Rates measured in the same run: "
            + '; '.join(rates) + '.')
    return ['## Implementations: eager and compiled, against the roofline', '',
            *markdown_table(header, body), '', note, '']


def benchmark_markdown(rows: List[dict], comparisons: List[dict], metrics: Optional[dict],
                       command: str, env: Dict[str, str]) -> str:
    """``benchmark.md``: the command, the environment, the measurements, the comparisons and
    the metrics, each table when there is something to show."""
    lines = ['# Benchmark', '', f'Reproduce: `{command}`', '',
             'Environment: ' + ', '.join(f'{k} {v}' for k, v in env.items()), '']
    if rows:
        lines += _measurement_rows(rows)
    if comparisons:
        lines += _comparison_rows(comparisons)
        lines += _impl_rows(comparisons)
    if metrics:
        lines += ['## Accuracy (single-scale)', '',
                  *markdown_table(['metric', 'value'],
                                  [(k, f'{v:.4g}') for k, v in metrics.items()]), '']
    return '\n'.join(lines)


def _plot(rows: List[dict], path: str) -> bool:
    ok = [r for r in rows if not r.get('error') and r.get('latency_ms') is not None]
    if not ok:
        return False
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    series: Dict[str, List[dict]] = {}
    for r in ok:
        series.setdefault(f'{r["label"]} {r["dtype"]} {r["mode"]}', []).append(r)
    for name, rs in series.items():
        rs = sorted(rs, key=lambda r: r['size'][0] * r['size'][1])
        mpx = [r['size'][0] * r['size'][1] / 1e6 for r in rs]
        axes[0].plot(mpx, [r['latency_ms'] for r in rs], marker='o', label=name)
        if all(r.get('peak_mem_mib') is not None for r in rs):
            axes[1].plot(mpx, [r['peak_mem_mib'] for r in rs], marker='o', label=name)
    for ax, ylabel in zip(axes, ('latency (ms, median)', 'peak memory (MiB)')):
        ax.set_xlabel('input megapixels (H x W / 1e6)')
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle('cost vs input resolution')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _compare_csv(comparisons: List[dict], path: str) -> None:
    others = _other_baselines(comparisons)
    with open(path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(COMPARE_FIELDS + [c for b in others for c in (f'{b}_ms', f'ratio_{b}')])
        for c in comparisons:
            for key in _compare_keys(comparisons):
                v = c.get(key)
                if v is not None:
                    w.writerow([c['label'], size_str(c['size']), c['batch'], key,
                                v.get('ours_ms'), v.get('timm_ms'), v.get('ratio'),
                                v.get('ours_mem_mib'), v.get('timm_mem_mib'),
                                c.get('max_rel_err'), c.get('bf16_max_rel_err'),
                                c.get('fp16_max_rel_err')]
                               + [v.get(k) for b in others for k in (f'{b}_ms', f'ratio_{b}')])


def write_report(out_dir: str, rows: List[dict], comparisons: List[dict],
                 metrics: Optional[dict], command: str, env: Dict[str, str]) -> Dict[str, str]:
    """Write ``benchmark.md``, ``benchmark.csv`` and ``benchmark.png`` (with ``rows``) and
    ``compare.csv`` (with ``comparisons``) into ``out_dir``.

    Returns:
        dict[str, str]: the paths written, keyed ``md``, ``csv``, ``png``, ``compare_csv``
        (and ``metrics``, the markdown file, when there are metrics).
    """
    os.makedirs(out_dir, exist_ok=True)
    paths = dict(md=os.path.join(out_dir, 'benchmark.md'))
    with open(paths['md'], 'w') as f:
        f.write(benchmark_markdown(rows, comparisons, metrics, command, env))
    if rows:
        paths['csv'] = os.path.join(out_dir, 'benchmark.csv')
        with open(paths['csv'], 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=ROW_FIELDS, extrasaction='ignore')
            w.writeheader()
            for r in rows:
                w.writerow({**r, 'size': size_str(r['size'])})
        if _plot(rows, os.path.join(out_dir, 'benchmark.png')):
            paths['png'] = os.path.join(out_dir, 'benchmark.png')
    if comparisons:
        paths['compare_csv'] = os.path.join(out_dir, 'compare.csv')
        _compare_csv(comparisons, paths['compare_csv'])
    if metrics:
        paths['metrics'] = paths['md']
    return paths
