"""What ``tools/analysis/benchmark.py`` writes: ``benchmark.md`` (the tables, the command that
reproduces them, the environment), ``benchmark.csv`` (one row per measurement), ``compare.csv``
(one row per compared arch, size and pass) and ``benchmark.png``. The printed tables are
``torch.utils.benchmark.Compare``'s; the markdown and CSV tables hold the same rows and columns.
"""
import csv
import math
import os
import platform
from typing import Any, Dict, List, Sequence

import torch

from deepvit_mm.engine.allocator import cpu_allocator

__all__ = ['environment', 'fmt', 'size_str', 'markdown_table', 'write_report']

# benchmark.csv's columns, in order
ROW_FIELDS = ['label', 'size', 'batch', 'dtype', 'mode', 'impl', 'device', 'threads', 'warmup',
              'repeats', 'latency_ms', 'latency_iqr_ms', 'latency_min_ms', 'throughput', 'cpu_ms',
              'peak_mem_mib', 'mem_before_mib', 'mem_peak_mib', 'tensor_peak_mib', 'mem_method',
              'first_call_ms', 'error']
# compare.csv's first columns; every other figure of a comparison follows them
COMPARE_FIELDS = ['label', 'size', 'batch', 'pass', 'ours_ms', 'timm_ms', 'ratio']


def environment(device: str) -> Dict[str, str]:
    """What the numbers depend on: versions, CPU/GPU, threads, the malloc, load."""
    cpu = platform.processor() or platform.machine()
    if os.path.exists('/proc/cpuinfo'):
        with open('/proc/cpuinfo') as f:
            cpu = next((ln.split(':', 1)[1].strip() for ln in f if ln.startswith('model name')), cpu)
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


def comparison_rows(comparisons: List[dict]) -> List[dict]:
    """``compare``'s results as one flat row per arch, size and pass: its figures in that mode,
    its output errors and the device rates."""
    rows = []
    for c in comparisons:
        common = {**{k: v for k, v in c.items() if k.endswith('max_rel_err')},
                  **{f'rate_{k}': v for k, v in c.get('rates', {}).items()}}
        for key in (k for k in c if isinstance(c[k], dict) and k.endswith(('fp32', 'bf16', 'fp16'))):
            rows.append(dict(label=c['label'], size=size_str(c['size']), batch=c['batch'],
                             **{'pass': key}, **c[key], **common))
    return rows


def _columns(rows: List[dict], first: Sequence[str]) -> List[str]:
    return list(first) + list(dict.fromkeys(k for r in rows for k in r if k not in first))


def _write(path: str, rows: List[dict], fields: Sequence[str]) -> None:
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction='ignore')
        w.writeheader()
        w.writerows(rows)


def _cell(v: Any) -> str:
    """Floats with 2 decimals, or 3 significant digits below 0.01 (errors); the rest as is."""
    if isinstance(v, float) and 0 < abs(v) < 0.01:
        return f'{v:.2e}'
    return fmt(v, 2) if isinstance(v, float) else '-' if v is None else str(v)


def _markdown(rows: List[dict], fields: Sequence[str]) -> List[str]:
    return markdown_table(fields, [[_cell(r.get(k)) for k in fields] for r in rows]) + ['']


def _plot(rows: List[dict], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    series: Dict[str, List[dict]] = {}
    for r in rows:
        series.setdefault(f'{r["label"]} {r["dtype"]} {r["mode"]}', []).append(r)
    for name, rs in series.items():
        rs.sort(key=lambda r: r['size'][0] * r['size'][1])
        mpx = [r['size'][0] * r['size'][1] / 1e6 for r in rs]
        for ax, key in zip(axes, ('latency_ms', 'peak_mem_mib')):
            ax.plot(mpx, [r[key] for r in rs], marker='o', label=name)
    for ax, ylabel in zip(axes, ('latency (ms, median)', 'peak memory (MiB)')):
        ax.set(xlabel='input megapixels (H x W / 1e6)', ylabel=ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out_dir: str, rows: List[dict], comparisons: List[dict], command: str,
                 env: Dict[str, str]) -> Dict[str, str]:
    """Write ``benchmark.md`` and, where there is something to write, ``benchmark.csv`` and
    ``benchmark.png`` (``rows``: ``measure``'s results) and ``compare.csv`` (``comparisons``:
    ``compare``'s) into ``out_dir``; the paths written, keyed ``md``, ``csv``, ``png``,
    ``compare_csv``."""
    os.makedirs(out_dir, exist_ok=True)
    paths = dict(md=os.path.join(out_dir, 'benchmark.md'))
    md = ['# Benchmark', '', f'Reproduce: `{command}`', '',
          'Environment: ' + ', '.join(f'{k} {v}' for k, v in env.items()), '']
    if rows:
        flat = [dict(r, size=size_str(r['size'])) for r in rows]
        paths['csv'] = os.path.join(out_dir, 'benchmark.csv')
        _write(paths['csv'], flat, ROW_FIELDS)
        md += ['## Measurements', '', *_markdown(flat, ROW_FIELDS)]
        timed = [r for r in rows if r.get('latency_ms') is not None
                 and r.get('peak_mem_mib') is not None]
        if timed:
            paths['png'] = os.path.join(out_dir, 'benchmark.png')
            _plot(timed, paths['png'])
    if comparisons:
        flat = comparison_rows(comparisons)
        fields = _columns(flat, COMPARE_FIELDS)
        paths['compare_csv'] = os.path.join(out_dir, 'compare.csv')
        _write(paths['compare_csv'], flat, fields)
        md += ['## Ours against the baselines', '', *_markdown(flat, fields)]
    with open(paths['md'], 'w') as f:
        f.write('\n'.join(md) + '\n')
    return paths
