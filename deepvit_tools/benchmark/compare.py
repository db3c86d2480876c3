"""Our backbone against baselines, in one process, interleaved call by call.

``compare`` times our backbone against baselines (``baselines.BASELINES``: timm's
``forward_intermediates`` + the same adapter; the GEMM floor) for each pass and dtype, with
``measure``'s timing and memory, and checks that outputs meant to be equal are
(``max_rel_err``). With ``compile``, each model that computes ours is also timed under
``torch.compile`` (``ours_compiled``, ``timm_compiled``), its first call (the compilation) kept
apart; with ``roofline``, each eager model's pass is held against this device's roofline
(``roofline.py``: its operators' FLOPs and bytes at the GEMM rate and copy bandwidth measured in
the same run).
"""
import statistics
from contextlib import contextmanager, nullcontext
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from deepvit_mm.deploy.parity import max_rel_err
from deepvit_mm.engine.allocator import release_free_memory

from .baselines import BASELINES
from .batches import backbone_input
from .measure import (
    AUTOCAST_DTYPES,
    COMPARE_MODES,
    DTYPES,
    Case,
    autocast_for,
    interleaved,
    measure_isolated,
    pass_runner,
    time_calls,
    torch_threads,
)
from .memory import peak_memory
from .models import build_backbone, speed_options
from .roofline import device_rates, pass_cost
from .roofline import roofline as roofline_of

__all__ = ['compare', 'err_key', 'eager_name', 'COMPILED']

COMPILED = '_compiled'  # the suffix of a compiled model's name

_DTYPE_NAMES = {torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16'}


@contextmanager
def _no_tf32():
    """Full float32 precision for CUDA convs and matmuls inside the block."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@contextmanager
def _recompile_limit(n: int):
    """Dynamo's per-function recompilation limit raised to ``n`` inside the block: each pass,
    dtype and TF32 setting is one compilation of the same forward (the default, 8, would fall
    back to eager without an error)."""
    import torch._dynamo.config as cfg
    name = 'recompile_limit' if hasattr(cfg, 'recompile_limit') else 'cache_size_limit'
    saved = getattr(cfg, name)
    setattr(cfg, name, max(n, saved))
    try:
        yield
    finally:
        setattr(cfg, name, saved)
        torch._dynamo.reset()


def err_key(name: str, dtype: str) -> str:
    """The key of ``name``'s largest relative error in ``dtype`` in ``compare``'s result."""
    prefix = '' if name == 'timm' else f'{name}_'  # 'max_rel_err' stays timm's (older reports)
    return f'{prefix}{"" if dtype == "fp32" else dtype + "_"}max_rel_err'


def eager_name(impl: str) -> str:
    """The eager model a compiled one wraps (``ours_compiled`` -> ``ours``); others unchanged."""
    return impl[:-len(COMPILED)] if impl.endswith(COMPILED) else impl


def compare(arch: str, size: Tuple[int, int], batch: int = 1, device: str = 'cpu',
            threads: int = 0, warmup: int = 1, repeats: int = 3, memory: bool = True,
            modes: Sequence[Tuple[str, str]] = COMPARE_MODES,
            backbone_kwargs: Optional[dict] = None,
            baselines: Sequence[str] = ('timm',), compile: bool = False,
            roofline: bool = False) -> dict:
    """Our backbone against ``baselines`` (names of ``baselines.BASELINES``) built from it.

    All get the same input; timing interleaves them call by call (rotating which goes first) so
    that all see the same machine load. Memory (when ``memory``) is measured per implementation
    in fresh processes (``measure_isolated``) on CPU, and in this process on CUDA
    (``max_memory_allocated`` is exact per pass).

    Args:
        arch (str): A backbone arch (XCiT or CaiT).
        size (tuple[int, int]): Input ``(H, W)``.
        batch (int): Images per call. Default: 1.
        device (str): ``cpu`` or ``cuda``. Default: ``cpu``.
        threads (int): Torch threads while comparing (restored after); 0: torch's. Default: 0.
        warmup (int): Untimed calls of each implementation per mode. Default: 1.
        repeats (int): Timed calls of each implementation per mode. Default: 3.
        memory (bool): Also measure each one's peak memory. Default: True.
        modes (Sequence[tuple[str, str]]): ``(pass, dtype)`` pairs timed. Default: all four.
        backbone_kwargs (dict, optional): The backbone's arguments (e.g. ``gram_xca=True``).
        baselines (Sequence[str]): What ours is compared with. Default: ``('timm',)``.
        compile (bool): Also time ours and the baselines whose outputs equal ours under
            ``torch.compile`` (default mode), as ``{name}_compiled``. Default: False.
        roofline (bool): Also count each eager model's pass (FLOPs, bytes) and hold its time
            against this device's roofline, measured in the same run. Default: False.

    Returns:
        dict: the settings; ``max_rel_err`` (fp32 eval outputs, ours vs timm, see
        ``max_rel_err``) and ``bf16_max_rel_err`` / ``fp16_max_rel_err`` (when such a mode is
        timed), for each baseline whose outputs must equal ours; and for each mode, keyed
        ``{pass}_{dtype}``: ``ours_ms`` and ``{name}_ms`` (medians), ``ratio`` (ours / timm) and
        ``ratio_{name}`` (ours / any other baseline), ``{impl}_mem_mib`` when ``memory`` (ours and
        the baselines whose outputs equal ours). With ``compile``: ``{name}_compiled_ms``,
        ``{name}_compiled_vs_eager`` (compiled / eager), every model's ``{impl}_first_ms`` (its
        first call in that mode: the compiled ones' compilation), and the compiled models' errors
        against their eager models in the inference modes timed (``ours_compiled_max_rel_err``,
        ``ours_compiled_bf16_max_rel_err``...; TF32 as timed). With ``roofline``: ``rates``
        (``{dtype}_tflops``, ``copy_tbs``) and per mode ``{impl}_roofline_ms``,
        ``{impl}_compute_ms``, ``{impl}_memory_ms``, ``{impl}_gflop``, ``{impl}_gbyte`` of the
        eager models and ``{impl}_vs_roofline`` (time / roofline; a compiled model against its
        eager model's roofline).
    """
    backbone_kwargs = dict(backbone_kwargs or {})
    device = str(device)
    with torch_threads(threads), (_recompile_limit(64) if compile else nullcontext()):
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
            checked += [name + COMPILED for name in ['ours'] + checked]
        x = backbone_input(size, batch, device)
        out = dict(model=arch, label=arch, size=tuple(size), batch=batch, device=device,
                   threads=torch.get_num_threads(), warmup=warmup, repeats=repeats,
                   speed_options=speed_options(ours), baselines=list(baselines),
                   compiled=bool(compile))
        rates = {}
        if roofline:
            wanted = [torch.float32] + [AUTOCAST_DTYPES[d] for _, d in modes if d != 'fp32']
            rates = device_rates(device, wanted)
            out['rates'] = {**{f'{_DTYPE_NAMES[k]}_tflops': v / 1e12 for k, v in rates.items()
                               if k != 'copy'}, 'copy_tbs': rates['copy'] / 1e12}
        for m in models.values():
            m.eval()
        # the check is of the math: TF32 convs/matmuls (cuDNN's default on recent GPUs) would turn
        # float32 rounding differences into ~1e-4 TF32 rounding flips in the adapter's convs
        with torch.no_grad(), _no_tf32():
            for dtype in DTYPES:
                if dtype != 'fp32' and not any(d == dtype for _, d in modes):
                    continue
                with autocast_for(device, dtype):
                    ref = ours(x)
                    for name in [n for n in checked if n in eager]:
                        out[err_key(name, dtype)] = max_rel_err(models[name](x), ref)

        for mode, dtype in modes:
            runs = {k: pass_runner(m, (lambda m=m: m(x)), mode, device, dtype)
                    for k, m in models.items()}
            res = {}
            if compile:  # before any other call in this mode: the compiled ones compile here
                for k, run in runs.items():
                    res[f'{k}_first_ms'] = time_calls(run, device, 1)[0] * 1e3
            times = interleaved(runs, device, warmup, repeats)
            res.update({f'{k}_ms': statistics.median(v) * 1e3 for k, v in times.items()})
            for name in baselines:
                res['ratio' if name == 'timm' else f'ratio_{name}'] = \
                    res['ours_ms'] / res[f'{name}_ms']
            for k in models:
                if k != eager_name(k):
                    res[f'{k}_vs_eager'] = res[f'{k}_ms'] / res[f'{eager_name(k)}_ms']
            if roofline:
                for k in ['ours'] + [n for n in checked if n in eager]:
                    for key, v in roofline_of(pass_cost(runs[k]), rates).items():
                        res[f'{k}_{key}'] = v
                for k in models:
                    roof = res.get(f'{eager_name(k)}_roofline_ms')
                    if roof is not None:
                        res[f'{k}_vs_roofline'] = res[f'{k}_ms'] / roof
            # memory of what computes the same as ours (the floor's is not a model's)
            mem_of = ['ours'] + checked if memory else []
            if device.startswith('cuda'):
                for k in mem_of:
                    res[f'{k}_mem_mib'] = peak_memory(runs[k], device)[0]
            else:
                release_free_memory()  # what the timing freed: the fresh processes need it
                for k in [k for k in mem_of if k in eager]:
                    m = measure_isolated(Case(arch, size, batch, dtype, mode, device, threads,
                                              warmup=0, repeats=0, impl=k,
                                              cfg_options=backbone_kwargs))
                    res[f'{k}_mem_mib'] = m.get('peak_mem_mib')
            out[f'{mode}_{dtype}'] = res

        # the compiled models after the timing (compiling for the check would warm the timed
        # first calls), against their own eager model, whose state they share (the training
        # passes have moved BatchNorm statistics by stochastic depth's random draws, differently
        # in ours and timm's trunk), in the inference modes they were timed in, under the same
        # TF32 setting (dynamo guards on it: another setting would compile once more)
        for m in models.values():
            m.eval()
        with torch.no_grad():
            for dtype in [d for m, d in modes if m == 'fwd']:
                with autocast_for(device, dtype):
                    for name in [n for n in checked if n not in eager]:
                        ref = models[eager_name(name)](x)
                        out[err_key(name, dtype)] = max_rel_err(models[name](x), ref)
    return out
