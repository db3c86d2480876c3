"""``FastestStepHook``: train in the precision and thread count whose step is fastest on this CPU.

CPUs of one machine kind differ in what makes a training step fast: with AVX512-BF16 a bfloat16
autocast step can be faster than float32 or slower, depending on the CPU and the model
(docs/training.md#mixed-precision), without it bfloat16 is emulated; a second thread may be a
second core or a hyperthread of the first, and competes with the data workers. A table of CPU
names cannot say which: ``FastestStepHook`` measures it on the run's own iterations.
After ``warmup`` iterations in the configured setting (in float32 where the configured bfloat16 is
emulated; a detector's heads get busier as its RPN starts to find objects), the next iterations
cycle through the candidate settings, ``rounds`` times, each timed whole (forward, backward,
optimizer step); from then on the run trains in the setting of the lowest median, and the log gives
every time and the choice. Every ``recheck`` iterations one more iteration of each setting is timed
and the choice made again from the medians of all the times so far, so that a disturbance during
the first trial (another process on the cores for a few seconds) cannot fix a slower setting for
the whole run.

These are ordinary training iterations (nothing is run twice); only the precision of the few trial
iterations differs from the rest. The choice is saved in the checkpoints and a resumed run keeps
it; in a distributed run every process times its own iterations and all take the setting fastest
for their sum. The thread count is set back when training ends. Timing the run's own iterations,
not a separate forward and backward, takes in everything a step costs (the optimizer, the data
workers competing for the cores, the hooks).
"""
import logging
import statistics
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ...utils import unwrap_model
from ..optimizers.cpu_amp_optim_wrapper import CPUAmpOptimWrapper, cpu_has_bfloat16

__all__ = ['FastestStepHook']

Setting = Tuple[str, int]  # (precision, threads)


@HOOKS.register_module()
class FastestStepHook(Hook):
    """Time training iterations under each candidate precision and thread count, then train with
    the fastest (CPU runs with ``CPUAmpOptimWrapper``; see the module docstring).

    Args:
        precisions (Sequence[str]): Candidates among ``'float32'`` and the wrapper's ``dtype``
            (``'bfloat16'``); bfloat16 is left out on a CPU without native bfloat16 (AVX512-BF16
            or AMX), where it is emulated. Default: ``('float32', 'bfloat16')``.
        threads (Sequence[int], optional): Thread counts to try. Default: 1 and torch's current
            count (the cores given to the process), once each.
        warmup (int): Iterations in the configured setting before the trial. Default: 10.
        rounds (int): Trial iterations of each setting, cycled; the median counts. Default: 3.
        recheck (int): Iterations between two later rounds of the trial (one iteration of each
            setting), after which the choice is made again from all the times; 0: never.
            Default: 100.
    """
    priority = 'LOWEST'  # the setting is applied after the other hooks' before_train_iter

    def __init__(self, precisions: Sequence[str] = ('float32', 'bfloat16'),
                 threads: Optional[Sequence[int]] = None, warmup: int = 10,
                 rounds: int = 3, recheck: int = 100) -> None:
        bad = [p for p in precisions if p not in ('float32', 'bfloat16')]
        if bad or not precisions:
            raise ValueError(f"FastestStepHook: precisions must be among 'float32' and "
                             f"'bfloat16', got {list(precisions)!r}")
        if threads is not None and (not threads or any(
                not isinstance(t, int) or t < 1 for t in threads)):
            raise ValueError(f'FastestStepHook: threads must be positive integers, got {threads!r}')
        for name, value, low in (('warmup', warmup, 0), ('rounds', rounds, 1),
                                 ('recheck', recheck, 0)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f'FastestStepHook: {name} must be an integer >= {low}, got '
                                 f'{value!r}')
        self.precisions = tuple(precisions)
        self.threads = None if threads is None else tuple(threads)
        self.warmup, self.rounds, self.recheck = warmup, rounds, recheck
        self.chosen: Optional[Setting] = None
        self._candidates: List[Setting] = []
        self._first = 0  # the first iteration of the trial window to come (or going on)
        self._cycle: List[Setting] = []  # the setting of each iteration of that window, in order
        self._times: Dict[Setting, List[float]] = {}
        self._start = 0.0
        self._threads_before = torch.get_num_threads()
        self._active = False

    # ------------------------------------------------------------------ the choice, kept
    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self.chosen is not None:
            checkpoint.setdefault('meta', {})['fastest_step'] = list(self.chosen)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        saved = checkpoint.get('meta', {}).get('fastest_step')
        if saved is not None:  # a resumed run goes on as it started
            self.chosen = (str(saved[0]), int(saved[1]))

    # ------------------------------------------------------------------ the trial
    def before_train(self, runner) -> None:
        wrapper = runner.optim_wrapper
        model = unwrap_model(runner.model)
        if not (isinstance(wrapper, CPUAmpOptimWrapper)
                and all(p.device.type == 'cpu' for p in model.parameters())):
            print_log('FastestStepHook: the run does not train on CPU with CPUAmpOptimWrapper; '
                      'its precision and threads are left as they are.', logger='current',
                      level=logging.WARNING)
            return
        self._active = True
        self._threads_before = torch.get_num_threads()
        self._candidates = self.candidates(wrapper)
        self._times = {c: [] for c in self._candidates}
        if len(self._candidates) == 1:
            self._choose(wrapper, [0.0])
            return
        if self.chosen is not None:  # resumed: the saved choice, rechecked from here on
            self._apply(wrapper, self.chosen)
            self._schedule(runner.iter + self.recheck, rounds=1)
            return
        configured = 'bfloat16' if wrapper.autocast else 'float32'
        if configured not in {p for p, _ in self._candidates}:
            # bfloat16 configured on a CPU that emulates it: the warm-up iterations run in a
            # setting that is tried instead (emulated bfloat16 is far slower than float32:
            # docs/training.md#mixed-precision)
            warm = max((c for c in self._candidates if c[0] == 'float32'), key=lambda c: c[1])
            self._apply(wrapper, warm)
            print_log(f'FastestStepHook: {configured} is emulated on this CPU; the warm-up '
                      f'iterations train in {warm[0]} with {warm[1]} thread(s).',
                      logger='current')
        self._schedule(runner.iter + self.warmup, rounds=self.rounds)

    def _schedule(self, first: int, rounds: int) -> None:
        if self.chosen is not None and self.recheck == 0:
            self._cycle = []
            return
        self._first, self._cycle = first, self._candidates * rounds

    def _trial_setting(self, runner) -> Optional[Setting]:
        """The setting this iteration tries, or None outside a trial window (mmengine counts
        the iteration after its ``after_train_iter`` hooks, so both hooks see the same index)."""
        k = runner.iter - self._first
        if self._active and 0 <= k < len(self._cycle):
            return self._cycle[k]
        return None

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        setting = self._trial_setting(runner)
        if setting is not None:
            self._apply(runner.optim_wrapper, setting)
            self._start = time.perf_counter()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        setting = self._trial_setting(runner)
        if setting is None:
            return
        self._times[setting].append(time.perf_counter() - self._start)
        if runner.iter - self._first == len(self._cycle) - 1:
            self._choose(runner.optim_wrapper,
                         [statistics.median(self._times[c]) for c in self._candidates])
            self._schedule(runner.iter + 1 + self.recheck, rounds=1)

    def after_train(self, runner) -> None:
        if self._active:
            torch.set_num_threads(self._threads_before)

    # ------------------------------------------------------------------ helpers
    def candidates(self, wrapper: CPUAmpOptimWrapper) -> List[Setting]:
        """The settings tried: precisions (bfloat16 only where the CPU computes it natively and
        the wrapper's dtype is bfloat16) times thread counts."""
        precisions = [p for p in self.precisions if p == 'float32' or (
            cpu_has_bfloat16() and wrapper.cast_dtype == getattr(torch, p))]
        threads = self.threads or tuple(sorted({1, torch.get_num_threads()}))
        return [(p, t) for p in precisions for t in threads]

    def _choose(self, wrapper: CPUAmpOptimWrapper, medians: List[float]) -> None:
        candidates = self._candidates
        if len(candidates) > 1 and dist.is_available() and dist.is_initialized():
            total = torch.tensor(medians, dtype=torch.float64)
            dist.all_reduce(total)
            medians = total.tolist()
        before, self.chosen = self.chosen, candidates[medians.index(min(medians))]
        self._apply(wrapper, self.chosen)
        if len(candidates) > 1 and self.chosen != before:
            timed = ', '.join(f'{p} {t} thread(s) {m:.3f} s'
                              for (p, t), m in zip(candidates, medians))
            n = len(self._times[candidates[0]])
            print_log(f'FastestStepHook: training iterations (median of {n}) {timed}; '
                      f'training in {self.chosen[0]} with {self.chosen[1]} thread(s) from here.',
                      logger='current')

    @staticmethod
    def _apply(wrapper: CPUAmpOptimWrapper, setting: Setting) -> None:
        precision, threads = setting
        wrapper.autocast = precision != 'float32'
        torch.set_num_threads(threads)
