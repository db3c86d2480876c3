"""Imported by training processes of tests/engine/hooks/test_resume.py and
tests/engine/distributed/test_distributed.py (not collected by pytest): the checkpoint write whose
path contains $SLOW_SAVE_MATCH writes half its bytes, flushes them, creates $SLOW_SAVE_MARKER and
hangs, so that the test can kill the process in the middle of the write (under torchrun: on the
job's first attempt only)."""
import os
import time

from mmengine.fileio.backends import LocalBackend

_put = LocalBackend.put


def _slow_put(self, obj: bytes, filepath) -> None:
    if os.environ.get('SLOW_SAVE_MATCH', '\0') not in str(filepath) \
            or os.environ.get('TORCHELASTIC_RESTART_COUNT', '0') != '0':
        return _put(self, obj, filepath)
    with open(filepath, 'wb') as f:
        f.write(obj[:len(obj) // 2])
        f.flush()
        os.fsync(f.fileno())
    open(os.environ['SLOW_SAVE_MARKER'], 'w').close()
    time.sleep(600)


LocalBackend.put = _slow_put
