"""What deepvit_mm reads of mmengine's internals (supported: 0.10.3 to 0.10.x; tested: 0.10.3 and
0.10.7).

* ``FSDPStrategy``: mmengine's FSDP strategy class, which it exports only from its private
  ``mmengine._strategy`` (its registry ``STRATEGIES`` has it by name), for
  ``GlobalNormFSDPStrategy`` to subclass (0.10.3, 0.10.7).
"""
from mmengine._strategy import FSDPStrategy

__all__ = ['FSDPStrategy']
