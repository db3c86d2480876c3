"""Train in whichever precision and thread count runs the step fastest on this CPU, measured.

CPUs of one machine kind differ in what makes a training step fast: with AVX512-BF16 a bfloat16
autocast step can be faster than float32 (1.2x for the detection demo on an AMD EPYC) or slower
(an Intel Xeon with the same flags, for XCiT-S12/8), without it bfloat16 is emulated; a second
thread may be a second core or a hyperthread of the first. A table of CPU names cannot say which:
``FastestStepHook`` measures it. Before the first training iteration it times the run's own step
(forward and backward of the first batch) under every candidate setting, interleaved, then trains
with the fastest, and logs the times and the choice. The probe leaves no trace: the model's weights
and buffers, its gradients and the random number generators are restored, so the run is the one
the chosen setting would have run without the probe. The choice is saved in the checkpoints and
kept by ``--resume``. In a distributed run every process times its own step and all take the
setting fastest for their sum.
"""
import copy
import logging
import random
import statistics
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from ..compat.torch import cpu_has_bfloat16
from .amp import CPUAmpOptimWrapper

__all__ = ['FastestStepHook']

Setting = Tuple[str, int]  # (precision, threads)


@HOOKS.register_module()
class FastestStepHook(Hook):
    """Time the training step under each candidate precision and thread count at the start of
    training (CPU runs with ``CPUAmpOptimWrapper``), then train with the fastest.

    Args:
        precisions (Sequence[str]): Candidates among ``'float32'`` and the wrapper's ``dtype``
            (``'bfloat16'``); bfloat16 is left out on a CPU without native bfloat16 (AVX512-BF16
            or AMX), where it is emulated. Default: ``('float32', 'bfloat16')``.
        threads (Sequence[int], optional): Thread counts to try. Default: 1 and torch's current
            count (the cores given to the process), once each.
        rounds (int): Timed steps of each setting, interleaved, after one untimed step of each;
            the median counts. Default: 3.
    """
    priority = 'LOWEST'  # after the hooks that prepare the iteration

    def __init__(self, precisions: Sequence[str] = ('float32', 'bfloat16'),
                 threads: Optional[Sequence[int]] = None, rounds: int = 3) -> None:
        bad = [p for p in precisions if p not in ('float32', 'bfloat16')]
        if bad or not precisions:
            raise ValueError(f"FastestStepHook: precisions must be among 'float32' and "
                             f"'bfloat16', got {list(precisions)!r}")
        if threads is not None and (not threads or any(
                not isinstance(t, int) or t < 1 for t in threads)):
            raise ValueError(f'FastestStepHook: threads must be positive integers, got {threads!r}')
        if not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f'FastestStepHook: rounds must be a positive integer, got {rounds!r}')
        self.precisions = tuple(precisions)
        self.threads = None if threads is None else tuple(threads)
        self.rounds = rounds
        self.chosen: Optional[Setting] = None
        self._applied = False

    # ------------------------------------------------------------------ the choice, kept
    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.chosen is not None:
            checkpoint.setdefault('meta', {})['fastest_step'] = list(self.chosen)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        saved = checkpoint.get('meta', {}).get('fastest_step')
        if saved is not None:  # a resumed run goes on as it started
            self.chosen = (str(saved[0]), int(saved[1]))

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._applied:
            return
        self._applied = True
        wrapper = runner.optim_wrapper
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        on_cpu = all(p.device.type == 'cpu' for p in model.parameters())
        if not (isinstance(wrapper, CPUAmpOptimWrapper) and on_cpu):
            print_log('FastestStepHook: the run does not train on CPU with CPUAmpOptimWrapper; '
                      'its precision and threads are left as they are.', logger='current',
                      level=logging.WARNING)
            return
        if self.chosen is None:
            self.chosen = self._probe(model, data_batch, wrapper)
        precision, threads = self.chosen
        wrapper.autocast = precision != 'float32'
        torch.set_num_threads(threads)

    # ------------------------------------------------------------------ measuring
    def _candidates(self, wrapper: CPUAmpOptimWrapper) -> List[Setting]:
        precisions = [p for p in self.precisions if p == 'float32' or (
            cpu_has_bfloat16() and wrapper.cast_dtype == getattr(torch, p))]
        threads = self.threads or tuple(sorted({1, torch.get_num_threads()}))
        return [(p, t) for p in precisions for t in threads]

    def _probe(self, model: torch.nn.Module, data_batch, wrapper: CPUAmpOptimWrapper) -> Setting:
        candidates = self._candidates(wrapper)
        if len(candidates) == 1:
            return candidates[0]
        saved = _snapshot(model)
        threads = torch.get_num_threads()
        times: Dict[Setting, List[float]] = {c: [] for c in candidates}
        try:
            for r in range(self.rounds + 1):
                for c in candidates:
                    seconds = _time_step(model, data_batch, *c)
                    if r:  # the first round warms every setting up
                        times[c].append(seconds)
        finally:
            torch.set_num_threads(threads)
            _restore(model, saved)
        medians = [statistics.median(times[c]) for c in candidates]
        if dist.is_available() and dist.is_initialized():
            total = torch.tensor(medians, dtype=torch.float64)
            dist.all_reduce(total)
            medians = total.tolist()
        best = candidates[medians.index(min(medians))]
        timed = ', '.join(f'{p} {t} thread(s) {m:.3f} s' for (p, t), m in zip(candidates, medians))
        print_log(f'FastestStepHook: training step (median of {self.rounds}) {timed}; training in '
                  f'{best[0]} with {best[1]} thread(s).', logger='current')
        return best


def _time_step(model: torch.nn.Module, data_batch, precision: str, threads: int) -> float:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=precision == 'bfloat16'):
        data = model.data_preprocessor(data_batch, True)
        losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    loss.backward()
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds


def _snapshot(model: torch.nn.Module) -> dict:
    return dict(state=copy.deepcopy(model.state_dict()),
                grads={n: None if p.grad is None else p.grad.clone()
                       for n, p in model.named_parameters()},
                rng=(torch.get_rng_state(), np.random.get_state(), random.getstate()),
                training=model.training)


def _restore(model: torch.nn.Module, saved: dict) -> None:
    model.load_state_dict(saved['state'])
    for n, p in model.named_parameters():
        p.grad = saved['grads'][n]
    torch.set_rng_state(saved['rng'][0])
    np.random.set_state(saved['rng'][1])
    random.setstate(saved['rng'][2])
    model.train(saved['training'])
