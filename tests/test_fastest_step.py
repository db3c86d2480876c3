"""FastestStepHook: the training step timed under each candidate precision and thread count, the
fastest taken, and no trace of the probe in the run."""
import pytest
import torch
from conftest import DEMO_DET
from mmengine.runner import Runner

import deepvit_mm.runtime.fastest_step as fastest_step
from deepvit_mm.compat.torch import cpu_has_bfloat16
from deepvit_mm.runtime import FastestStepHook, prepare_config

ITERS = 3


def _config(tmp_path, shapes, hook: bool):
    cfg = prepare_config(DEMO_DET, work_dir=str(tmp_path), amp=True, cfg_options={
        'train_dataloader.dataset.data_root': f'{shapes}/',
        'model.backbone.arch': 'nano_12_p16',
        'train_dataloader.batch_size': 1, 'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'train_dataloader.dataset.pipeline.2.scale': (96, 64),
        'train_dataloader.dataset.pipeline.2.keep_ratio': False,
        'model.train_cfg.rcnn.sampler.num': 32, 'train_cfg.max_iters': ITERS,
        'val_cfg': None, 'val_dataloader': None, 'val_evaluator': None,
        'param_scheduler.0.end': 1, 'param_scheduler.1.begin': 1,
        'param_scheduler.1.end': ITERS, 'default_hooks.logger.interval': 1,
        'default_hooks.checkpoint.interval': ITERS})
    if hook:
        threads = torch.get_num_threads()  # the suite's count: a test leaves it as it found it
        cfg.custom_hooks.append(dict(type='FastestStepHook', threads=[threads], rounds=1))
    return cfg


def _train(cfg) -> Runner:
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


@pytest.mark.parametrize('winner', ['float32', 'bfloat16'])
def test_the_fastest_setting_trains_as_if_there_were_no_probe(shapes, tmp_path, monkeypatch,
                                                              winner):
    """The probe really runs the step in every setting (forward, backward: BatchNorm statistics,
    gradients, random draws of the RPN's and RoI sampler's), and the run that follows is
    bit-identical to a run of the winning setting without the hook."""
    if winner == 'bfloat16' and not cpu_has_bfloat16():
        pytest.skip('bfloat16 is a candidate only on CPUs with native bfloat16')
    timed = []
    real = fastest_step._time_step

    def time_step(model, data, precision, threads):
        timed.append(precision)
        real(model, data, precision, threads)
        return 1.0 if precision == winner else 2.0
    monkeypatch.setattr(fastest_step, '_time_step', time_step)
    probed = _train(_config(tmp_path / 'probed', shapes, hook=True))
    hook = next(h for h in probed.hooks if isinstance(h, FastestStepHook))
    assert hook.chosen == (winner, torch.get_num_threads())
    candidates = ['float32', 'bfloat16'] if cpu_has_bfloat16() else ['float32']
    assert timed == candidates * 2  # one untimed round, one timed
    assert probed.optim_wrapper.autocast == (winner == 'bfloat16')
    plain_cfg = _config(tmp_path / 'plain', shapes, hook=False)
    if winner == 'float32':  # a plain float32 run
        plain_cfg.optim_wrapper.type = 'OptimWrapper'
        plain_cfg.optim_wrapper.pop('dtype')
    plain = _train(plain_cfg)
    mine, theirs = probed.model.state_dict(), plain.model.state_dict()
    assert mine.keys() == theirs.keys()
    assert [k for k in mine if not torch.equal(mine[k], theirs[k])] == []
    # the choice is kept in the checkpoint, and a resumed run goes on with it
    ckpt = torch.load(tmp_path / 'probed' / f'iter_{ITERS}.pth', weights_only=False)
    assert ckpt['meta']['fastest_step'] == [winner, torch.get_num_threads()]
    resumed = FastestStepHook()
    resumed.after_load_checkpoint(None, ckpt)
    assert resumed.chosen == (winner, torch.get_num_threads())


def test_bfloat16_is_no_candidate_without_native_support(monkeypatch):
    from deepvit_mm.runtime import CPUAmpOptimWrapper
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(torch.nn.Linear(2, 2).parameters(),
                                                           lr=0.1))
    monkeypatch.setattr(fastest_step, 'cpu_has_bfloat16', lambda: False)
    assert FastestStepHook(threads=[1, 2])._candidates(wrapper) == [('float32', 1),
                                                                    ('float32', 2)]
    monkeypatch.setattr(fastest_step, 'cpu_has_bfloat16', lambda: True)
    assert FastestStepHook(threads=[2])._candidates(wrapper) == [('float32', 2), ('bfloat16', 2)]


def test_another_wrapper_is_left_as_it_is(monkeypatch):
    said = []
    monkeypatch.setattr(fastest_step, 'print_log', lambda msg, **kwargs: said.append(msg))

    class Runner:
        optim_wrapper = object()
        model = torch.nn.Linear(2, 2)
    threads = torch.get_num_threads()
    FastestStepHook().before_train_iter(Runner(), 0, None)
    assert torch.get_num_threads() == threads
    assert len(said) == 1 and 'does not train on CPU with CPUAmpOptimWrapper' in said[0]


@pytest.mark.parametrize('kwargs,match', [
    (dict(precisions=('float16',)), "precisions must be among 'float32' and 'bfloat16'"),
    (dict(precisions=()), 'precisions must be among'),
    (dict(threads=[0]), 'threads must be positive integers'),
    (dict(rounds=0), 'rounds must be a positive integer'),
])
def test_bad_arguments_say_what_to_pass(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FastestStepHook(**kwargs)
