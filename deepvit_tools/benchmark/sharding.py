"""Per-process memory of a distributed training run, for DDP against FSDP
(``tools/analysis/benchmark_sharding.py``).

``ModelStateMemoryHook`` (registered in mmengine's ``HOOKS``; the training processes import this
module through ``custom_imports``) writes ``memory_rank<r>.json`` into the work dir at the end of
training: the model state this process holds, counted from its tensors (weights and their
gradients: the trainable parameters it holds, under FSDP its shards; the optimizer's state
tensors), and its peak resident set over the run (the kernel's high-water mark, reset when
training starts, so model building is not in it).
"""
import json
import os.path as osp

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from .memory import current_rss, peak_rss, reset_peak_rss

__all__ = ['ModelStateMemoryHook', 'model_state_bytes']


def model_state_bytes(model, optimizer) -> dict:
    """Bytes of the weights, gradients (one per trainable weight, as the backward writes them)
    and optimizer state that this process holds."""
    params = {id(p): p for p in model.parameters()}.values()
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if hasattr(t, 'numel') and t.dim() > 0)
    return dict(weights=weights, grads=grads, optimizer=state)


@HOOKS.register_module()
class ModelStateMemoryHook(Hook):
    """Writes this process's model-state bytes and peak resident set (module docstring)."""
    priority = 'LOWEST'

    def before_train(self, runner) -> None:
        self.reset = reset_peak_rss()
        self.rss_start = current_rss()

    def after_train(self, runner) -> None:
        out = model_state_bytes(runner.model, runner.optim_wrapper.optimizer)
        out.update(rank=runner.rank, world_size=runner.world_size,
                   wrapper=type(runner.model).__name__, rss_start=self.rss_start,
                   peak_rss=peak_rss(since_reset=self.reset), hwm_reset=self.reset)
        with open(osp.join(runner.work_dir, f'memory_rank{runner.rank}.json'), 'w') as f:
            json.dump(out, f)
