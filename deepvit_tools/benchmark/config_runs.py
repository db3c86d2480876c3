"""Whole runs of a config's model: one training step's peak memory and time, and
``tools/test.py``'s evaluation of a checkpoint."""
import numbers
import os
import time
from typing import Dict, Optional

import torch
from mmengine.optim import build_optim_wrapper

from .batches import synthetic_data
from .isolation import run_isolated
from .memory import peak_memory
from .models import build_from_config, load_config, num_classes_of

__all__ = ['measure_train_step', 'evaluate_checkpoint']


def measure_train_step(config: str, *, with_cp: Optional[bool] = None, batch_size: int = 1,
                       height: int = 800, width: int = 1344, num_objects: int = 10,
                       cfg_options: Optional[dict] = None, seed: int = 0,
                       device: str = 'cpu') -> Dict[str, float]:
    """Peak memory and time of one training step (``model.train_step``: data preprocessor,
    forward, backward, optimizer step with its state) of ``config`` on a synthetic batch.

    Built as mmengine's Runner builds them (no weights file, SyncBN -> BN); run it in a fresh
    process (``run_isolated``). A segmentor's training preprocessor pads up to its crop size.

    Args:
        config (str): An mmdet or mmseg config with a deepvit_mm backbone.
        with_cp (bool, optional): Override ``model.backbone.with_cp``. Default: the config's.
        batch_size (int): Images in the batch. Default: 1.
        height (int): Image height. Default: 800.
        width (int): Image width. Default: 1344.
        num_objects (int): Ground-truth instances per image (detectors). Default: 10.
        cfg_options (dict, optional): More config overrides.
        seed (int): Seed of the weights, the batch and the RoI sampling. Default: 0.
        device (str): ``cpu`` or ``cuda``. Default: ``cpu``.

    Returns:
        dict: ``peak_rss_mib`` (the whole process's peak during the step: resident set on CPU,
        allocated tensor memory on CUDA), ``before_step_mib`` (model, optimizer and batch built),
        ``step_peak_mib`` (their difference: what the step itself needs), ``mem_method``,
        ``step_seconds``, ``loss`` and the settings measured.
    """
    cfg = load_config(config, cfg_options)
    if with_cp is not None:
        cfg.model.backbone.with_cp = with_cp
    torch.manual_seed(seed)
    model, task = build_from_config(cfg)
    model = model.to(device).train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    data = synthetic_data(task, (height, width), batch_size, num_classes_of(model, task),
                          num_objects, seed)
    torch.manual_seed(seed)
    log_vars = {}
    t0 = time.perf_counter()
    step, method, absolute = peak_memory(lambda: log_vars.update(model.train_step(data,
                                                                                  optim_wrapper)),
                                         device)
    seconds = time.perf_counter() - t0
    return dict(with_cp=bool(cfg.model.backbone.get('with_cp', False)), batch_size=batch_size,
                height=height, width=width, device=device, peak_rss_mib=round(absolute['peak'], 1),
                before_step_mib=round(absolute['before'], 1), step_peak_mib=round(step, 1),
                mem_method=method, step_seconds=round(seconds, 1),
                loss=float(torch.as_tensor(log_vars['loss']).detach()),
                threads=torch.get_num_threads())


def _test(config: str, checkpoint: str, work_dir: str, cfg_options: Optional[dict]) -> dict:
    # the body of tools/test.py's main() without its display options: the same calls in order
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from deepvit_mm.apis import prepare_config
    from deepvit_mm.engine import keep_freed_cpu_memory, setup_cpu_distributed
    if not torch.cuda.is_available():
        keep_freed_cpu_memory()  # process-wide, as tools/test.py: this process only
    cfg = prepare_config(config, work_dir=work_dir, cfg_options=cfg_options, load_from=checkpoint)
    setup_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    return {k: float(v) for k, v in runner.test().items() if isinstance(v, numbers.Real)}


def evaluate_checkpoint(config: str, checkpoint: str, work_dir: str,
                        cfg_options: Optional[dict] = None, timeout: Optional[float] = None
                        ) -> Dict[str, float]:
    """Evaluate ``checkpoint`` on ``config``'s test set as ``tools/test.py`` does
    (``prepare_config``, then mmengine's ``Runner.test``), in a fresh process.

    Args:
        config (str): An mmdet or mmseg config.
        checkpoint (str): The checkpoint file.
        work_dir (str): Where the test run's logs go.
        cfg_options (dict, optional): Config overrides (e.g. the test set's ``data_root``).
        timeout (float, optional): Seconds before giving up. Default: None.

    Returns:
        dict[str, float]: the evaluator's metrics (e.g. ``mIoU``, ``aAcc``, ``mAcc``).

    Raises:
        FileNotFoundError: The checkpoint or config does not exist.
        RuntimeError: The evaluation failed (``isolation.IsolatedError``).
    """
    for path, what in ((checkpoint, 'checkpoint'), (config, 'config')):
        if not os.path.isfile(path):
            raise FileNotFoundError(f'{what} not found: {path!r}')
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    return run_isolated(_test, config, checkpoint, work_dir, cfg_options, device=device,
                        timeout=timeout)
