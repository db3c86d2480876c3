"""What the tools do around a run (``deepvit_mm.apis.runs``)."""
import gc
import subprocess
import sys

import pytest

from deepvit_mm.apis import objects_frozen


def test_objects_are_frozen_while_the_run_lasts_and_thawed_after_it_even_on_exit():
    before = gc.get_freeze_count()
    with objects_frozen():
        assert gc.get_freeze_count() > before
    assert gc.get_freeze_count() == 0
    with pytest.raises(SystemExit), objects_frozen():
        sys.exit('training stopped')  # the tools' one-line stop
    assert gc.get_freeze_count() == 0


@pytest.mark.slow
def test_nothing_is_left_frozen_for_the_interpreters_exit():
    """A process that froze its objects in the block exits as one that never froze them: no
    object of an extension module is left unfreed (nanobind's leak report on stderr with
    triton 3.9, which timm imports through torchvision on torch 2.15). Starts a process that
    imports timm and deepvit_mm, ~5 s."""
    code = ('import timm, deepvit_mm\nfrom deepvit_mm.apis import objects_frozen\n'
            'with objects_frozen():\n    pass\n')
    run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and 'leaked' not in run.stderr, run.stderr[-2000:]
