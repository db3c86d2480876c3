"""Where a backbone's time goes, each kind of work against its own floor.

``op_breakdown`` profiles one call of a backbone's pass (``torch.profiler``, CPU) and groups the
operators' own time by kind: matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``...),
convolutions, GELU, normalisation, softmax, copies and layout changes, other element-wise work.
In the same process, interleaved with the model, it times the two floors the kinds are held
against:

* matrix products: ``GemmFloor``'s products (the standard model's block GEMMs) give this
  machine's GEMM rate at these shapes; the model's own products (multiply-adds counted by the
  profiler) at that rate are their floor;
* GELU (exact, ``erf``: bound by arithmetic, not memory): ``F.gelu`` on one contiguous tensor
  of the MLP's hidden size gives its rate (elements/s); the elements the model's GELU calls
  (and their backward) take at that rate are their floor;
* memory-bound work (normalisation, softmax, copies, other element-wise): a plain ``torch.add``
  over tensors of the MLP's hidden size gives the machine's streaming rate (bytes/s); the bytes
  each operator reads and writes (its inputs' and outputs' sizes, as the profiler records them)
  at that rate are their floor.

* convolutions: their multiply-adds (counted by the profiler) at the GEMM rate, a lower bound
  (oneDNN reaches less on the patch embedding's 3-channel input).

Two floors for the whole pass: ``GemmFloor``'s time (the standard model's block GEMMs alone: the
least any implementation of the blocks must do) and the sum of the kinds' floors (every kind of
work this implementation does, each at its own rate: what it would take if nothing but the rates
limited it).
"""
import math
import statistics
from typing import Dict, List, Tuple

import torch

from .baselines import GemmFloor
from .batches import backbone_input
from .measure import pass_runner, time_calls
from .models import build_backbone, padded_size

__all__ = ['KINDS', 'profiled_work', 'op_breakdown', 'breakdown_markdown']

KINDS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('matrix products', ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm',
                         'aten::addmm_', 'aten::baddbmm_', 'aten::_addmm_activation')),
    ('convolutions', ('aten::mkldnn_convolution', 'aten::_convolution', 'aten::convolution',
                      'aten::conv2d', 'aten::convolution_backward', 'aten::_slow_conv2d_forward',
                      'aten::thnn_conv2d', 'aten::_nnpack_spatial_convolution',
                      'aten::mkldnn_convolution_backward')),
    ('GELU', ('aten::gelu', 'aten::gelu_backward')),
    ('normalisation', ('aten::native_layer_norm', 'aten::native_layer_norm_backward',
                       'aten::native_batch_norm', 'aten::native_batch_norm_backward',
                       'aten::_batch_norm_impl_index', 'aten::batch_norm',
                       'aten::_native_batch_norm_legit_no_training',
                       'aten::_native_batch_norm_legit', 'aten::linalg_vector_norm',
                       'aten::norm', 'aten::clamp_min')),
    ('softmax', ('aten::_softmax', 'aten::_softmax_backward_data')),
    ('copies and layout', ('aten::copy_', 'aten::clone', 'aten::contiguous', 'aten::cat',
                           'aten::constant_pad_nd', 'aten::pixel_shuffle', 'aten::col2im',
                           'aten::im2col', 'aten::_reshape_alias', 'aten::index_select')),
)
_VIEWS = frozenset(f'aten::{n}' for n in (
    'view', 'reshape', '_reshape_alias', 'as_strided', 'transpose', 'permute', 't', 'expand',
    'unsqueeze', 'squeeze', 'select', 'slice', 'split', 'chunk', 'unbind', 'narrow', 'flatten',
    'unflatten', 'detach', 'alias', 'empty', 'empty_like', 'empty_strided', 'resize_',
    'set_', 'lift_fresh', 'view_as', 'expand_as', 'contiguous', 'to', 'result_type'))
_COUNTED = ('matrix products', 'convolutions')  # multiply-adds counted; others: bytes moved


def _kind(name: str) -> str:
    for kind, names in KINDS:
        if name in names:
            return kind
    return 'other element-wise'


def _numel(shape) -> int:
    return math.prod(int(d) for d in shape)


def _product_macs(name: str, shapes) -> int:
    """Multiply-adds of a matrix product from its input shapes (the profiler counts none for the
    in-place variants ``addmm_``/``baddbmm_``, which the inference path uses)."""
    mats = [s for s in (shapes or []) if isinstance(s, (list, tuple)) and len(s) in (2, 3)]
    if name in ('aten::addmm', 'aten::addmm_', 'aten::baddbmm', 'aten::baddbmm_',
                'aten::_addmm_activation'):
        mats = mats[1:3] if len(mats) >= 3 else mats[-2:]
    else:
        mats = mats[:2]
    if len(mats) != 2:
        return 0
    a, b = mats
    batch = a[0] if len(a) == 3 else 1
    return batch * a[-2] * a[-1] * b[-1]


def _event_bytes(e) -> int:
    """Bytes an operator reads and writes: the sizes of its tensor inputs (float32 assumed) and of
    an output as large as its largest input."""
    shapes = [s for s in (e.input_shapes or []) if isinstance(s, (list, tuple)) and s
              and all(isinstance(d, int) for d in s)]
    if not shapes:
        return 0
    return 4 * (sum(_numel(s) for s in shapes) + max(_numel(s) for s in shapes))


def profiled_work(fn) -> Dict[str, Dict[str, float]]:
    """Run ``fn`` once under ``torch.profiler`` (CPU) and group its operators' own time by kind:
    ``{kind: {'seconds', 'calls', 'macs', 'bytes', 'elements'}}``; multiply-adds for matrix
    products and convolutions, bytes moved for the memory-bound kinds, elements for GELU."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        fn()
    kinds: Dict[str, Dict[str, float]] = {}
    for e in prof.events():
        kind, self_s = _kind(e.name), e.self_cpu_time_total / 1e6
        leaf = all(c.name in _VIEWS for c in e.cpu_children)  # allocations and views only
        if self_s <= 0 and not (e.flops and kind in _COUNTED):
            continue  # e.g. aten::conv2d: its time is its children's, its count is here
        k = kinds.setdefault(kind, dict(seconds=0.0, calls=0, macs=0, bytes=0, elements=0))
        k['seconds'] += self_s
        k['calls'] += self_s > 0
        if kind == 'matrix products':
            k['macs'] += _product_macs(e.name, e.input_shapes)
        elif kind in _COUNTED:
            k['macs'] += int(e.flops or 0) // 2
        elif leaf and e.name not in _VIEWS:  # wrappers' bytes are their children's
            k['bytes'] += _event_bytes(e)
            if kind == 'GELU' and e.input_shapes and e.input_shapes[0]:
                k['elements'] += _numel(e.input_shapes[0])
    return kinds


def op_breakdown(arch: str, size: Tuple[int, int] = (800, 1344), mode: str = 'fwd',
                 repeats: int = 3, **backbone_kwargs) -> dict:
    """Profile one ``mode`` pass (``'fwd'`` inference, ``'train'`` forward + backward) of a
    backbone on CPU and hold each kind of work against its floor (see the module's docstring).

    Returns:
        dict: ``total_s`` (median wall time of ``repeats`` unprofiled calls), ``kinds``
        (``{kind: {'seconds', 'calls', 'macs', 'bytes', 'elements', 'floor_s'}}`` from one profiled call,
        seconds scaled so they sum to ``total_s``), ``gemm_rate`` (floor multiply-adds per
        second), ``stream_rate`` (bytes per second), ``gelu_rate`` (elements per second),
        ``floor_s`` (``GemmFloor``'s median time), ``kinds_floor_s`` (the sum of the kinds'
        floors) and the settings.
    """
    torch.manual_seed(0)
    model = build_backbone(arch, **backbone_kwargs)
    x = backbone_input(size, 1)
    run = pass_runner(model, lambda: model(x), mode, 'cpu', 'fp32')
    floor = GemmFloor(model, size, 1)
    run_floor = pass_runner(floor, lambda: floor(x), mode, 'cpu', 'fp32')
    h, w = padded_size(model, size)
    tokens = (h // model.patch_size) * (w // model.patch_size)
    a, b = torch.randn(tokens, 4 * model.embed_dim), torch.randn(tokens, 4 * model.embed_dim)
    # (the MLP's hidden map: the largest tensor of a block)
    out = torch.empty_like(a)

    def run_stream():
        torch.add(a, b, out=out)

    def run_gelu():
        torch.nn.functional.gelu(a)

    run(), run_floor(), run_stream(), run_gelu()  # warm-up
    total, floor_s, stream_s, gelu_s = [], [], [], []
    for _ in range(repeats):  # interleaved
        total.append(statistics.median(time_calls(run, 'cpu', 1)))
        floor_s.append(statistics.median(time_calls(run_floor, 'cpu', 1)))
        stream_s.append(statistics.median(time_calls(run_stream, 'cpu', 5)))
        gelu_s.append(statistics.median(time_calls(run_gelu, 'cpu', 5)))
    floor_macs = floor.multiply_adds * (3 if mode == 'train' else 1)
    gemm_rate = floor_macs / statistics.median(floor_s)
    stream_rate = 3 * a.numel() * 4 / statistics.median(stream_s)
    gelu_rate = a.numel() / statistics.median(gelu_s)
    kinds = profiled_work(run)
    scale = statistics.median(total) / max(sum(k['seconds'] for k in kinds.values()), 1e-9)
    for kind, k in kinds.items():
        k['seconds'] *= scale  # the profiled call is slower than an unprofiled one
        if kind in _COUNTED:
            k['floor_s'] = k['macs'] / gemm_rate
        elif kind == 'GELU':
            k['floor_s'] = k['elements'] / gelu_rate
        else:
            k['floor_s'] = k['bytes'] / stream_rate
    order = [kind for kind, _ in KINDS] + ['other element-wise']
    return dict(arch=arch, size=list(size), mode=mode, threads=torch.get_num_threads(),
                total_s=statistics.median(total), floor_s=statistics.median(floor_s),
                floor_macs=floor_macs, gemm_rate=gemm_rate, stream_rate=stream_rate,
                gelu_rate=gelu_rate, kinds_floor_s=sum(k['floor_s'] for k in kinds.values()),
                kinds={kind: kinds[kind] for kind in order if kind in kinds})


def breakdown_markdown(result: dict) -> List[str]:
    """A markdown table of ``op_breakdown``'s result."""
    lines = ['| work | seconds | share | calls | GMAC | GB moved | its floor (s) | / floor |',
             '|---|---:|---:|---:|---:|---:|---:|---:|']
    total = result['total_s']
    for kind, k in result['kinds'].items():
        fl = k.get('floor_s')
        lines.append(
            f"| {kind} | {k['seconds']:.2f} | {100 * k['seconds'] / total:.0f} % | {k['calls']} "
            f"| {k['macs'] / 1e9:.1f} | {k['bytes'] / 1e9:.1f} | "
            + (f'{fl:.2f} | {k["seconds"] / fl:.2f} |' if fl else ' | |'))
    lines.append(f"| **all** | {total:.2f} | | | | | block GEMMs {result['floor_s']:.2f} | "
                 f"**{total / result['floor_s']:.2f}** |")
    if 'kinds_floor_s' in result:
        lines.append(f"| **all** | {total:.2f} | | | | | sum of the floors "
                     f"{result['kinds_floor_s']:.2f} | **{total / result['kinds_floor_s']:.2f}** |")
    lines.append('')
    lines.append(f"GEMM rate at the floor's shapes: {result['gemm_rate'] * 2 / 1e9:.0f} GFLOP/s; "
                 f"streaming rate (torch.add over the token map's size): "
                 f"{result['stream_rate'] / 1e9:.1f} GB/s; exact GELU on one contiguous tensor: "
                 f"{result['gelu_rate'] / 1e9:.2f} G elements/s.")
    return lines
