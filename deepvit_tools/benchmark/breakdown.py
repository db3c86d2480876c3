"""Where a backbone's CPU pass spends its time, each kind of work against its own floor.

Time per kind: one call profiled with ``torch.profiler`` (operators' self time, scaled to the
median unprofiled call). Work per kind: one more call under ``flops.WorkCounter``. Rates:
``roofline.device_rates`` at the MLP's shape (tokens x C by C x 4C; a stream and exact GELU over
the tokens x 4C hidden map), interleaved with the timed calls. The floors: multiply-adds at the
GEMM rate (matrix products, convolutions), elements at the GELU rate, bytes moved at the
streaming rate (the rest); for the whole pass, ``GemmFloor``'s block GEMMs at the GEMM rate and
the sum of the kinds' floors.
"""
import statistics
from typing import Callable, Dict, List, Tuple

import torch
from torch.utils.benchmark import Timer

from .baselines import GemmFloor
from .batches import backbone_input
from .flops import WorkCounter
from .models import build_backbone, padded_size
from .roofline import device_rates

__all__ = ['KINDS', 'op_breakdown', 'breakdown_markdown']

KINDS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (  # by aten name, at any level of the profile
    ('matrix products', ('mm', 'addmm', 'bmm', 'baddbmm', 'addmm_', 'baddbmm_',
                         '_addmm_activation')),
    ('convolutions', ('mkldnn_convolution', '_convolution', 'convolution', 'conv2d',
                      'convolution_backward', '_slow_conv2d_forward', 'thnn_conv2d',
                      '_nnpack_spatial_convolution', 'mkldnn_convolution_backward')),
    ('GELU', ('gelu', 'gelu_backward')),
    ('normalisation', ('native_layer_norm', 'native_layer_norm_backward', 'native_batch_norm',
                       'native_batch_norm_backward', '_batch_norm_impl_index', 'batch_norm',
                       '_native_batch_norm_legit_no_training', '_native_batch_norm_legit',
                       'linalg_vector_norm', 'norm', 'clamp_min')),
    ('softmax', ('_softmax', '_softmax_backward_data')),
    ('copies and layout', ('copy_', 'clone', 'contiguous', 'cat', 'constant_pad_nd', '_to_copy',
                           'pixel_shuffle', 'col2im', 'im2col', '_reshape_alias',
                           'index_select')),
)
_KIND = {name: kind for kind, names in KINDS for name in names}
_COUNTED = ('matrix products', 'convolutions')  # floors of multiply-adds; others: of bytes


def _kind(name: str) -> str:
    return _KIND.get(name.split('::')[-1], 'other element-wise')


def _pass(model: torch.nn.Module, x: torch.Tensor, mode: str) -> Callable[[], None]:
    """One ``'fwd'`` (eval, no autograd) or ``'train'`` (forward + backward) call."""
    def run() -> None:
        model.train(mode == 'train')
        with torch.set_grad_enabled(mode == 'train'):
            outs = model(x)
        if mode == 'train':
            sum(o.mean() for o in outs).backward()
            model.zero_grad(set_to_none=True)
    return run


def op_breakdown(arch: str, size: Tuple[int, int] = (800, 1344), mode: str = 'fwd',
                 repeats: int = 3, **backbone_kwargs) -> dict:
    """Profile a backbone's ``mode`` pass (``'fwd'`` or ``'train'``) on CPU in float32, each
    kind of work against its floor (the module's docstring).

    Returns:
        dict: ``total_s`` (median of ``repeats`` unprofiled calls), ``kinds`` (``{kind:
        {'seconds', 'calls', 'macs', 'bytes', 'elements', 'floor_s'}}``, seconds scaled to sum
        to ``total_s``), ``gemm_rate`` (multiply-adds/s), ``stream_rate`` (bytes/s),
        ``gelu_rate`` (elements/s), ``floor_macs`` and ``floor_s`` (``GemmFloor``'s
        multiply-adds, autograd's included, at the GEMM rate), ``kinds_floor_s`` and the
        settings.
    """
    torch.manual_seed(0)
    model = build_backbone(arch, **backbone_kwargs)
    run = _pass(model, backbone_input(size, 1), mode)
    h, w = padded_size(model, size)
    tokens, c = (h // model.patch_size) * (w // model.patch_size), model.embed_dim
    floor_macs = GemmFloor(model, size, 1).multiply_adds * (3 if mode == 'train' else 1)
    timer = Timer('run()', globals=dict(run=run), num_threads=torch.get_num_threads())
    timer.timeit(1)  # warm-up
    total, rates = [], []
    for _ in range(repeats):  # interleaved: the pass, then the rates (medians of 5 calls)
        total.append(timer.timeit(1).median)
        rates.append(device_rates('cpu', mlp=(tokens, c), gelu=True))
    gemm_rate = statistics.median(r[torch.float32] for r in rates) / 2
    stream_rate = statistics.median(r['copy'] for r in rates)
    gelu_rate = statistics.median(r['gelu'] for r in rates)
    new = dict(seconds=0.0, calls=0, macs=0, bytes=0, elements=0)
    kinds: Dict[str, Dict[str, float]] = {}
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    for e in prof.events():
        if e.self_cpu_time_total > 0:
            k = kinds.setdefault(_kind(e.name), dict(new))
            k['seconds'] += e.self_cpu_time_total / 1e6
            k['calls'] += 1
    with WorkCounter() as counter:
        run()
    for op in counter.ops:
        kind = _kind(op.name)
        k = kinds.setdefault(kind, dict(new))
        k['macs'] += op.flops // 2
        k['bytes'] += op.bytes
        k['elements'] += op.elements if kind == 'GELU' else 0
    scale = statistics.median(total) / max(sum(k['seconds'] for k in kinds.values()), 1e-9)
    for kind, k in kinds.items():
        k['seconds'] *= scale  # a profiled call is slower than an unprofiled one
        k['floor_s'] = (k['macs'] / gemm_rate if kind in _COUNTED else
                        k['elements'] / gelu_rate if kind == 'GELU' else k['bytes'] / stream_rate)
    order = [kind for kind, _ in KINDS] + ['other element-wise']
    return dict(arch=arch, size=list(size), mode=mode, threads=torch.get_num_threads(),
                total_s=statistics.median(total), floor_s=floor_macs / gemm_rate,
                floor_macs=floor_macs, gemm_rate=gemm_rate, stream_rate=stream_rate,
                gelu_rate=gelu_rate, kinds_floor_s=sum(k['floor_s'] for k in kinds.values()),
                kinds={kind: kinds[kind] for kind in order if kind in kinds})


def breakdown_markdown(result: dict) -> List[str]:
    """A markdown table of ``op_breakdown``'s result."""
    total = result['total_s']
    lines = ['| work | seconds | share | calls | GMAC | GB moved | its floor (s) | / floor |',
             '|---|---:|---:|---:|---:|---:|---:|---:|']
    for kind, k in result['kinds'].items():
        fl = k['floor_s']
        lines.append(
            f"| {kind} | {k['seconds']:.2f} | {100 * k['seconds'] / total:.0f} % | {k['calls']} "
            f"| {k['macs'] / 1e9:.1f} | {k['bytes'] / 1e9:.1f} | "
            + (f'{fl:.2f} | {k["seconds"] / fl:.2f} |' if fl else ' | |'))
    for name, floor in (('block GEMMs', result['floor_s']),
                        ('sum of the floors', result['kinds_floor_s'])):
        lines.append(f'| **all** | {total:.2f} | | | | | {name} {floor:.2f} | '
                     f'**{total / floor:.2f}** |')
    return lines + ['', f"GEMM rate at the MLP's shape: {result['gemm_rate'] * 2 / 1e9:.0f} "
                    f"GFLOP/s; streaming rate (torch.add over the MLP's hidden map): "
                    f"{result['stream_rate'] / 1e9:.1f} GB/s; exact GELU on that map: "
                    f"{result['gelu_rate'] / 1e9:.2f} G elements/s."]
