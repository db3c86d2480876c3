"""``CheckConsumersHook``: the neck's and heads' channels checked against the backbone before a run.

The check itself is ``deepvit_mm.models.utils.consumers``, which the tools' builders
(``deepvit_mm.apis``) also call. In a config::

    custom_hooks = [dict(type='CheckConsumersHook')]
"""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...models.utils.consumers import check_model

__all__ = ['CheckConsumersHook']


@HOOKS.register_module()
class CheckConsumersHook(Hook):
    """Before a run (training, validation or test) starts, check that the model's neck or heads
    were built for the channels and levels its ``ColumnarBackbone`` feeds them
    (``deepvit_mm.models.utils.consumers``): a mismatch stops with ``ChannelMismatchError``
    naming the config keys to set, instead of a shape error inside the neck at the first
    iteration. Models with another backbone are not checked.
    """
    priority = 'HIGHEST'  # before any other hook's before_run does work for a run that cannot go

    def before_run(self, runner) -> None:
        check_model(runner.model)
