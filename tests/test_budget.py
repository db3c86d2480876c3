"""tests/budget.py: a run fails where a test over the time limit is not marked slow or does not say
why in its docstring, with pytest-xdist's processes or without."""
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import TESTS

CASES = '''
import subprocess
import sys
import time
import pytest

def spin(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass

def test_quick():
    time.sleep(0.4)  # waiting costs no CPU time

def test_unmarked():
    spin(0.4)

@pytest.mark.slow
def test_marked_and_said():
    """Computes: the test of the budget."""
    spin(0.4)

@pytest.mark.slow
def test_marked_unsaid():  # the CPU time of a process it waited for counts
    subprocess.run([sys.executable, '-c', 'import time; t = time.process_time()\\n'
                    'while time.process_time() - t < 0.4: pass'], check=True)
'''


@pytest.mark.parametrize('workers', [
    pytest.param([], id='one process'),
    pytest.param(['-n', '2'], id='xdist', marks=pytest.mark.slow)])
def test_a_run_fails_on_a_test_over_the_limit(tmp_path, workers):
    """A pytest run of four tests, two over a limit of 0.2 s of CPU that break a rule (one of them
    in a process it starts), one that waits 0.4 s without computing. With pytest-xdist, ~5 s: its
    two processes start and import pytest."""
    (tmp_path / 'conftest.py').write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {TESTS!r})
        from budget import *  # noqa
        def pytest_configure(config):
            config.addinivalue_line('markers', 'slow: slow')
        """))
    (tmp_path / 'test_cases.py').write_text(CASES)
    run = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                          *workers, 'test_cases.py'], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**os.environ, 'DEEPVIT_TEST_SLOW_S': '0.2'})
    out = run.stdout
    assert run.returncode == 1 and '4 passed' in out, out[-3000:] + run.stderr[-2000:]
    section = out[out.index('time budget (tests/budget.py)'):].splitlines()[1:]
    section = sorted(line for line in section if '::' in line)
    assert len(section) == 2, out[-3000:]
    assert section[0].startswith('test_cases.py::test_marked_unsaid took ') and \
        section[0].endswith(' s of CPU (over 0.2 s) and has no docstring saying why'), section
    assert section[1].startswith('test_cases.py::test_unmarked took ') and section[1].endswith(
        ' s of CPU (over 0.2 s) and is not marked slow and has no docstring saying why'), section
