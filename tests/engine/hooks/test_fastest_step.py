"""FastestStepHook: after a warm-up, training iterations cycle through the candidate precisions and
thread counts, each timed; the run then trains in the fastest, keeps it through a resume and gives
the thread count back at the end."""
import os

import pytest
import torch
from conftest import DEMO_DET
from mmengine.hooks import Hook
from mmengine.runner import Runner

import deepvit_mm.engine.hooks.fastest_step_hook as fastest_step
from deepvit_mm.apis import prepare_config
from deepvit_mm.engine import CPUAmpOptimWrapper, FastestStepHook
from deepvit_mm.engine.optimizers.cpu_amp_optim_wrapper import cpu_has_bfloat16

WARMUP = 2


def _config(work_dir, shapes, iters: int, threads, resume: bool = False, recheck: int = 100):
    cfg = prepare_config(DEMO_DET, work_dir=str(work_dir), amp=True,
                         resume='auto' if resume else None, cfg_options={
        'train_dataloader.dataset.data_root': f'{shapes}/',
        'model.backbone.arch': 'nano_12_p16',
        'train_dataloader.batch_size': 1, 'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'train_dataloader.dataset.pipeline.2.scale': (96, 64),
        'train_dataloader.dataset.pipeline.2.keep_ratio': False,
        'model.train_cfg.rcnn.sampler.num': 32, 'train_cfg.max_iters': iters,
        'val_cfg': None, 'val_dataloader': None, 'val_evaluator': None,
        'param_scheduler.0.end': 1, 'param_scheduler.1.begin': 1,
        'param_scheduler.1.end': iters, 'default_hooks.logger.interval': 1,
        'default_hooks.checkpoint.interval': iters})
    cfg.custom_hooks.append(dict(type='FastestStepHook', threads=threads, warmup=WARMUP,
                                 rounds=1, recheck=recheck))
    return cfg


class _Settings(Hook):
    """Records the precision and threads each iteration trains with, and times the trial
    iterations by a fake clock: the winner's iterations take 1 s, the others 2 s."""
    priority = 'LOWEST'  # after FastestStepHook's before_train_iter

    def __init__(self, winner, disturbed=()):
        self.winner, self.seen, self.now, self.wrapper = winner, [], 0.0, None
        self.disturbed, self.iter = set(disturbed), 0  # iterations at which the winner takes 4 s

    def before_train(self, runner):
        self.wrapper = runner.optim_wrapper

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.iter = runner.iter
        self.seen.append(('bfloat16' if self.wrapper.autocast else 'float32',
                          torch.get_num_threads()))

    def perf_counter(self) -> float:
        setting = ('bfloat16' if self.wrapper.autocast else 'float32', torch.get_num_threads())
        step = 0.5 if setting == self.winner else 1.0  # called at the start and the end
        self.now += 4 * step if setting == self.winner and self.iter in self.disturbed else step
        return self.now


def _train(cfg, spy) -> Runner:
    runner = Runner.from_cfg(cfg)
    runner.register_hook(spy, priority='LOWEST')
    runner.train()
    return runner


@pytest.fixture
def two_threads():
    """The process trains with 2 threads (a test process may have 1: conftest.session_threads),
    so that the trial switches threads; given back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


@pytest.mark.parametrize('winner_precision', ['float32', 'bfloat16'])
@pytest.mark.slow
def test_the_trial_cycles_the_settings_then_trains_in_the_fastest(shapes, tmp_path, monkeypatch,
                                                                  winner_precision, two_threads):
    """FastestStepHook's trial on the demo detector (a fake clock): every setting tried, the winner
    kept and resumed. ~5-10 s: training iterations of the detector."""
    if winner_precision == 'bfloat16' and not cpu_has_bfloat16():
        pytest.skip('bfloat16 is a candidate only on CPUs with native bfloat16')
    threads = torch.get_num_threads()
    counts = [1, threads]
    winner = (winner_precision, counts[0])  # the fewest threads: a switch the run must make
    precisions = ['float32', 'bfloat16'] if cpu_has_bfloat16() else ['float32']
    candidates = [(p, t) for p in precisions for t in counts]
    iters = WARMUP + len(candidates) + 2
    spy = _Settings(winner)
    monkeypatch.setattr(fastest_step, 'time', spy)
    runner = _train(_config(tmp_path, shapes, iters, counts), spy)
    hook = next(h for h in runner.hooks if isinstance(h, FastestStepHook))
    assert hook.chosen == winner
    # CPUAmpOptimWrapper's dtype and the process's threads; where bfloat16 is emulated (no
    # candidate), float32 with the most threads tried
    configured = ('bfloat16', threads) if cpu_has_bfloat16() else ('float32', counts[-1])
    assert spy.seen == [configured] * WARMUP + candidates + [winner] * 2
    assert torch.get_num_threads() == threads  # given back when training ends
    ckpt = torch.load(tmp_path / f'iter_{iters}.pth', weights_only=False)
    assert ckpt['meta']['fastest_step'] == list(winner)
    # a resumed run trains in the saved setting at once: no second trial
    more = _config(tmp_path, shapes, iters + 2, counts, resume=True)
    spy2 = _Settings(('none', 0))
    monkeypatch.setattr(fastest_step, 'time', spy2)
    resumed = _train(more, spy2)
    assert resumed.iter == iters + 2 and spy2.seen == [winner] * 2


@pytest.mark.slow
def test_a_disturbed_trial_is_overruled_by_the_rechecks(shapes, tmp_path, monkeypatch, two_threads):
    """The first trial times the truly fastest setting while another process shares the cores
    (it looks slowest) and the run starts in another; the rechecks time each setting again and the
    run moves to the fastest once the medians of all the times say so."""
    counts = [1, 2]
    precisions = ['float32', 'bfloat16'] if cpu_has_bfloat16() else ['float32']
    candidates = [(p, t) for p in precisions for t in counts]
    winner, n = candidates[0], len(candidates)
    recheck = 1
    # windows: the trial at WARMUP, then one round each `recheck` iterations after the last
    windows = [WARMUP + k * (n + recheck) for k in range(3)]
    iters = windows[-1] + n + 2
    spy = _Settings(winner, disturbed={windows[0]})  # the winner's first trial iteration
    monkeypatch.setattr(fastest_step, 'time', spy)
    runner = _train(_config(tmp_path, shapes, iters, counts, recheck=recheck), spy)
    hook = next(h for h in runner.hooks if isinstance(h, FastestStepHook))
    assert hook.chosen == winner
    for w in windows:
        assert spy.seen[w:w + n] == candidates, w
    first_choice = spy.seen[windows[0] + n]
    assert first_choice != winner  # the disturbed trial chose another setting
    assert spy.seen[windows[1] + n] == first_choice  # one recheck: medians of 2 still tie it
    assert spy.seen[windows[2] + n:] == [winner] * (iters - windows[2] - n)


def test_bfloat16_is_no_candidate_without_native_support(monkeypatch):
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(torch.nn.Linear(2, 2).parameters(),
                                                           lr=0.1))
    monkeypatch.setattr(fastest_step, 'cpu_has_bfloat16', lambda: False)
    assert FastestStepHook(threads=[1, 2]).candidates(wrapper) == [('float32', 1),
                                                                   ('float32', 2)]
    monkeypatch.setattr(fastest_step, 'cpu_has_bfloat16', lambda: True)
    assert FastestStepHook(threads=[2]).candidates(wrapper) == [('float32', 2), ('bfloat16', 2)]


@pytest.mark.parametrize('native', [False, True])
def test_the_warmup_runs_in_a_setting_that_is_tried(native, monkeypatch):
    """bfloat16 configured where it is emulated (no candidate): the warm-up iterations run in
    float32 with the most threads tried, not in the emulated precision; where it is native, in the
    configured setting."""
    said = []
    monkeypatch.setattr(fastest_step, 'print_log', lambda msg, **kwargs: said.append(msg))
    monkeypatch.setattr(fastest_step, 'cpu_has_bfloat16', lambda: native)
    model = torch.nn.Linear(2, 2)

    class Runner:
        optim_wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                           dtype='bfloat16')
        iter = 0
    Runner.model = model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        FastestStepHook(threads=[1, 2]).before_train(Runner())
        assert Runner.optim_wrapper.autocast is native
        assert torch.get_num_threads() == (1 if native else 2)
        assert bool(said) is not native and all('emulated' in m for m in said)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_bfloat16_is_not_native_on_avx2_kernels():
    """Capped at its AVX2 kernels (an AVX2-only CPU, or ATEN_CPU_CAPABILITY=avx2), torch emulates
    bfloat16 whatever the CPU's flags: no bfloat16 candidate then."""
    import subprocess
    import sys
    code = ('from deepvit_mm.engine.optimizers.cpu_amp_optim_wrapper import cpu_has_bfloat16; '
            'print(cpu_has_bfloat16())')
    env = dict(os.environ, ATEN_CPU_CAPABILITY='avx2')
    run = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == 'False', run.stderr[-2000:]


def test_another_wrapper_is_left_as_it_is(monkeypatch):
    said = []
    monkeypatch.setattr(fastest_step, 'print_log', lambda msg, **kwargs: said.append(msg))

    class Runner:
        optim_wrapper = object()
        model = torch.nn.Linear(2, 2)
        iter = 0
    hook, threads = FastestStepHook(), torch.get_num_threads()
    hook.before_train(Runner())
    hook.before_train_iter(Runner(), 0, None)
    hook.after_train_iter(Runner(), 0, None)
    hook.after_train(Runner())
    assert torch.get_num_threads() == threads and hook.chosen is None
    assert len(said) == 1 and 'does not train on CPU with CPUAmpOptimWrapper' in said[0]


@pytest.mark.parametrize('kwargs,match', [
    (dict(precisions=('float16',)), "precisions must be among 'float32' and 'bfloat16'"),
    (dict(precisions=()), 'precisions must be among'),
    (dict(threads=[0]), 'threads must be positive integers'),
    (dict(rounds=0), 'rounds must be an integer >= 1'),
    (dict(warmup=-1), 'warmup must be an integer >= 0'),
    (dict(recheck=-1), 'recheck must be an integer >= 0'),
])
def test_bad_arguments_say_what_to_pass(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FastestStepHook(**kwargs)
