"""Our backbone against baselines (``baselines.BASELINES``: timm's ``forward_intermediates`` +
the same adapter; the GEMM floor), interleaved call by call in one process (``measure.timings``),
with the largest relative error between outputs meant to be equal; optionally each model under
``torch.compile`` and each eager pass against this device's roofline (``roofline.py``).
"""
import math
from contextlib import contextmanager
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.utils.benchmark import set_torch_threads

from deepvit_mm.deploy.parity import max_rel_err
from deepvit_mm.engine.allocator import release_free_memory

from .baselines import BASELINES
from .batches import backbone_input
from .measure import (
    AUTOCAST_DTYPES,
    COMPARE_MODES,
    Case,
    autocast_for,
    measure_isolated,
    pass_runner,
    timings,
)
from .memory import peak_memory
from .models import build_backbone, speed_options
from .roofline import device_rates, pass_cost
from .roofline import roofline as roofline_of

__all__ = ['compare', 'compare_grid']

COMPILED = '_compiled'  # the suffix of a compiled model's name
_DTYPE_NAMES = {torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16'}


@contextmanager
def _settings(compile: bool, tf32: bool = True):
    """TF32 for CUDA convs and matmuls as ``tf32`` says, and with ``compile`` dynamo's
    recompilation limit raised (each pass, dtype and TF32 setting compiles the forward once more;
    past the default 8 it would fall back to eager silently); both restored after."""
    import torch._dynamo.config as cfg
    name = 'recompile_limit' if hasattr(cfg, 'recompile_limit') else 'cache_size_limit'
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             getattr(cfg, name))
    if not tf32:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    if compile:
        setattr(cfg, name, max(64, saved[2]))
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[:2]
        if compile:
            setattr(cfg, name, saved[2])
            torch._dynamo.reset()


def err_key(name: str, dtype: str) -> str:
    """The key of ``name``'s largest relative error in ``dtype`` in ``compare``'s result."""
    prefix = '' if name == 'timm' else f'{name}_'
    return f'{prefix}{"" if dtype == "fp32" else dtype + "_"}max_rel_err'


def eager_name(impl: str) -> str:
    """The eager model a compiled one wraps (``ours_compiled`` -> ``ours``); others unchanged."""
    return impl[:-len(COMPILED)] if impl.endswith(COMPILED) else impl


def compare(arch: str, size: Tuple[int, int], batch: int = 1, device: str = 'cpu',
            threads: int = 0, warmup: int = 1, repeats: int = 3, memory: bool = True,
            modes: Sequence[Tuple[str, str]] = COMPARE_MODES,
            backbone_kwargs: Optional[dict] = None, baselines: Sequence[str] = ('timm',),
            compile: bool = False, roofline: bool = False) -> dict:
    """Our backbone against ``baselines`` built from it, on the same input, interleaved; memory
    in a fresh process per implementation on CPU, in this one on CUDA (exact per pass).

    Args:
        arch (str): A backbone arch.
        size (tuple[int, int]): Input ``(H, W)``.
        batch (int): Images per call. Default: 1.
        device (str): ``cpu`` or ``cuda``. Default: ``cpu``.
        threads (int): Torch threads (restored after); 0: torch's. Default: 0.
        warmup (int): Untimed calls of each implementation per mode. Default: 1.
        repeats (int): Timed calls of each implementation per mode. Default: 3.
        memory (bool): Also measure each one's peak memory. Default: True.
        modes (Sequence[tuple[str, str]]): ``(pass, dtype)`` pairs timed. Default: all.
        backbone_kwargs (dict, optional): The backbone's arguments (e.g. ``gram_xca=True``).
        baselines (Sequence[str]): What ours is compared with. Default: ``('timm',)``.
        compile (bool): Also time ours and the baselines equal to it under ``torch.compile``
            (default mode) as ``{name}_compiled``. Default: False.
        roofline (bool): Also hold each eager model's pass against the roofline. Default: False.

    Returns:
        dict: the settings, ``measurements`` (every ``Measurement``), ``err_key(name, dtype)``,
        ``rates`` (with ``roofline``) and per mode, keyed ``{pass}_{dtype}``, the columns of
        ``compare.csv`` (docs/benchmark.md).
    """
    backbone_kwargs = dict(backbone_kwargs or {})
    device = str(device)
    with set_torch_threads(threads or torch.get_num_threads()), _settings(compile):
        torch.manual_seed(0)
        ours = build_backbone(arch, **backbone_kwargs)
        for m in ours.modules():  # non-trivial BN statistics, so that the check covers them
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.8, 1.2)
        models = {'ours': ours}
        for name in baselines:  # built from ours before it moves: copies its trunk weights
            models[name] = BASELINES[name](ours, size, batch)
        models = {k: m.to(device) for k, m in models.items()}
        checked = [n for n in baselines if models[n].checks_output]
        eager = list(models)
        if compile:
            for name in ['ours'] + checked:
                models[name + COMPILED] = torch.compile(models[name])
        x = backbone_input(size, batch, device)
        label = f'{arch} {size[0]}x{size[1]} batch {batch}'
        out = dict(model=arch, label=arch, size=tuple(size), batch=batch, device=device,
                   threads=torch.get_num_threads(), warmup=warmup, repeats=repeats,
                   speed_options=speed_options(ours), baselines=list(baselines),
                   compiled=bool(compile), measurements=[])
        rates = {}
        if roofline:
            rates = device_rates(device, [torch.float32] + [AUTOCAST_DTYPES[d] for _, d in modes
                                                            if d != 'fp32'])
            out['rates'] = {**{f'{_DTYPE_NAMES[k]}_tflops': v / 1e12 for k, v in rates.items()
                               if k != 'copy'}, 'copy_tbs': rates['copy'] / 1e12}

        def errors(names: List[str], dtypes: Sequence[str], ref_of: Callable[[str], nn.Module]):
            for m in models.values():
                m.eval()
            with torch.no_grad():
                for dtype in dict.fromkeys(dtypes):
                    with autocast_for(device, dtype):
                        for name in names:
                            out[err_key(name, dtype)] = max_rel_err(models[name](x),
                                                                    ref_of(name)(x))

        # the check is of the math: with TF32 convs/matmuls (cuDNN's default on recent GPUs)
        # float32 rounding differences turn into ~1e-4 TF32 rounding flips in the adapter's convs
        with _settings(False, tf32=False):
            errors(checked, ['fp32'] + [d for _, d in modes], lambda name: ours)
        for mode, dtype in modes:
            runs = {k: pass_runner(m, (lambda m=m: m(x)), mode, device, dtype)
                    for k, m in models.items()}
            res = {}
            if compile:  # before any other call in this mode: the compiled ones compile here
                for k, run in runs.items():
                    res[f'{k}_first_ms'] = timings({k: run}, 0, 1)[k].times[0] * 1e3
            times = timings(runs, warmup, repeats, label=label, sub_label=f'{mode} {dtype}')
            out['measurements'] += times.values()
            res.update({f'{k}_ms': m.median * 1e3 for k, m in times.items()})
            for name in baselines:
                res['ratio' if name == 'timm' else f'ratio_{name}'] = \
                    res['ours_ms'] / res[f'{name}_ms']
            for k in models:
                if k != eager_name(k):
                    res[f'{k}_vs_eager'] = res[f'{k}_ms'] / res[f'{eager_name(k)}_ms']
            if roofline:
                for k in ['ours'] + checked:
                    for key, v in roofline_of(pass_cost(runs[k]), rates).items():
                        res[f'{k}_{key}'] = v
                for k in models:
                    if f'{eager_name(k)}_roofline_ms' in res:
                        res[f'{k}_vs_roofline'] = res[f'{k}_ms'] / res[f'{eager_name(k)}_roofline_ms']
            mem_of = [k for k in models if eager_name(k) in ['ours'] + checked] if memory else []
            if device.startswith('cuda'):
                for k in mem_of:
                    res[f'{k}_mem_mib'] = peak_memory(runs[k], device)[0]
            else:
                release_free_memory()  # what the timing freed: the fresh processes need it
                for k in [k for k in mem_of if k in eager]:
                    res[f'{k}_mem_mib'] = measure_isolated(Case(
                        arch, size, batch, dtype, mode, device, threads, warmup=0, repeats=0,
                        impl=k, cfg_options=backbone_kwargs)).get('peak_mem_mib')
            out[f'{mode}_{dtype}'] = res
        # the compiled models after the timing (compiling for the check would warm the timed
        # first calls), against their own eager model, whose state they share (training passes
        # move BatchNorm statistics by stochastic depth's own draws), under the TF32 setting timed
        errors([k for k in models if k not in eager], [d for m, d in modes if m == 'fwd'],
               lambda name: models[eager_name(name)])
    return out


def compare_grid(archs: Sequence[str], sizes: Sequence[Tuple[int, int]],
                 dtypes: Sequence[str] = ('fp32', 'bf16'), passes: Sequence[str] = ('fwd', 'train'),
                 log: Callable[[str], None] = print, **compare_kwargs) -> List[dict]:
    """``compare`` for every arch x size in the ``COMPARE_MODES`` that ``passes`` and ``dtypes``
    ask for (``compare_kwargs`` go to ``compare``), a line to ``log`` per result."""
    modes = [(m, d) for m, d in COMPARE_MODES if m in passes and d in dtypes]
    out = []
    for arch in archs if modes else []:
        for size in sizes:
            out.append(compare(arch, size, modes=modes, **compare_kwargs))
            log(f'  {arch} {size[0]}x{size[1]}: ' + ', '.join(
                f'{m} {d} ours / timm {out[-1][f"{m}_{d}"].get("ratio", math.nan):.3f}'
                for m, d in modes))
    return out
