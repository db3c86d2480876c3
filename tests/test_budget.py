"""tests/budget.py: a run fails where a test marked slow does not say why in its docstring, or a
test over twice the time limit is not marked slow, with pytest-xdist's processes or without; a test
over the limit and under twice it is named without failing the run."""
import os
import subprocess
import sys
import textwrap

import budget
import pytest
import torch
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
    time.sleep(0.2)  # waiting costs no CPU time

def test_unmarked_said():
    """Computes."""
    spin(0.3)

def test_unmarked_in_a_process():  # the CPU time of a process it waited for counts
    subprocess.run([sys.executable, '-c', 'import time; t = time.process_time()\\n'
                    'while time.process_time() - t < 0.3: pass'], check=True)

def test_unmarked_near():
    spin(0.14)

@pytest.mark.slow
def test_marked_and_said():
    """Computes: the test of the budget."""
    spin(0.2)

@pytest.mark.slow
def test_marked_unsaid():
    pass
'''


def _run(tmp_path, *args):
    (tmp_path / 'conftest.py').write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {TESTS!r})
        from budget import *  # noqa
        def pytest_configure(config):
            config.addinivalue_line('markers', 'slow: slow')
        """))
    (tmp_path / 'test_cases.py').write_text(CASES)
    run = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', *args,
                          'test_cases.py'], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, 'DEEPVIT_TEST_SLOW_S': '0.1',
                                           'DEEPVIT_TEST_CPU_CSV': str(tmp_path / 'cpu.csv')})
    return run, run.stdout + run.stderr[-2000:]


def _section(out: str, title: str) -> list:
    """The test lines of the section whose title starts with ``title``, sorted."""
    lines = out[out.index(title):].splitlines()[1:]
    section = []
    for line in lines:
        if '::' not in line:
            break
        section.append(line)
    return sorted(section)


@pytest.mark.parametrize('workers', [
    pytest.param([], id='one process'),
    pytest.param(['-n', '2'], id='xdist', marks=pytest.mark.slow)])
def test_a_run_fails_on_a_test_against_the_rules(tmp_path, workers):
    """A pytest run of six tests at a limit of 0.1 s of CPU: two over twice the limit without the
    mark (one of them in a process it starts), one over the limit and under twice it, one marked
    slow without a docstring, one that waits 0.2 s without computing. With pytest-xdist, ~5 s: its
    two processes start and import pytest."""
    run, out = _run(tmp_path, *workers, '--durations=2')
    assert run.returncode == 1 and '6 passed' in out, out[-5000:]
    failing = _section(out, 'time budget (tests/budget.py): these fail the run')
    assert len(failing) == 3, out[-3000:]
    assert failing[0] == 'test_cases.py::test_marked_unsaid is marked slow and has no docstring ' \
                         'saying why', failing
    for line, name in zip(failing[1:], ['test_unmarked_in_a_process', 'test_unmarked_said']):
        assert line.startswith(f'test_cases.py::{name} took ') and line.endswith(
            ' s of CPU (over 0.1 s) and is not marked slow'), failing
    named = _section(out, 'time budget (tests/budget.py): over the limit, under 2x it')
    assert len(named) == 1 and named[0].startswith('test_cases.py::test_unmarked_near took '), out
    # the sections come after --durations' table, at the end of the log
    assert out.index('slowest') < out.index('time budget'), out[-3000:]
    # every test's CPU seconds, the most first
    rows = [line.split(',') for line in (tmp_path / 'cpu.csv').read_text().splitlines()[1:]]
    assert len(rows) == 6 and [float(r[0]) for r in rows] == sorted(
        (float(r[0]) for r in rows), reverse=True), rows
    took = {r[1].split('::')[1]: float(r[0]) for r in rows}
    assert took['test_unmarked_said'] >= 0.3 and took['test_quick'] < 0.1, took


def test_a_test_over_the_limit_and_under_twice_it_is_named_and_the_run_passes(tmp_path):
    run, out = _run(tmp_path, '-k', 'near or quick or marked_and_said', '--durations=2')
    assert run.returncode == 0 and '3 passed' in out, out[-3000:]
    named = _section(out, 'time budget (tests/budget.py): over the limit, under 2x it')
    assert len(named) == 1 and named[0].startswith('test_cases.py::test_unmarked_near took '), out
    assert 'these fail the run' not in out, out


def test_the_limit_grows_with_a_slower_cpu_never_shrinks(monkeypatch):
    monkeypatch.delenv('DEEPVIT_TEST_SLOW_S', raising=False)
    for floor, limit in [(budget.FLOOR_S / 2, budget.SLOW_S), (budget.FLOOR_S, budget.SLOW_S),
                         (budget.FLOOR_S * 1.5, budget.SLOW_S * 1.5)]:
        monkeypatch.setattr(budget, '_FLOOR', [floor])
        assert budget.slow_limit() == pytest.approx(limit)
    monkeypatch.setenv('DEEPVIT_TEST_SLOW_S', '0.25')
    assert budget.slow_limit() == 0.25


def test_the_floor_is_timed_on_one_thread_and_gives_the_threads_back():
    threads = torch.get_num_threads()
    floor = budget.floor_seconds(repeats=1)
    assert torch.get_num_threads() == threads
    assert 0 < floor < 10 * budget.FLOOR_S, floor  # the work is the ~0.05 s it is meant to be


# ------------------------------------------------------------------ make test's second AVX2 pass
@pytest.mark.parametrize('capability, flags, env, already', [
    ('AVX2', {'avx2', 'fma'}, {}, True),  # an AVX2-only CPU (AMD Zen 3, most laptops of 2020)
    ('AVX512', {'avx2', 'avx512f', 'avx512bw'}, {}, False),  # torch's AVX-512 kernels
    ('AVX2', {'avx2', 'avx512f'}, {'ATEN_CPU_CAPABILITY': 'avx2'}, False),  # oneDNN still AVX-512
    ('AVX2', {'avx2', 'avx512f', 'amx_bf16'}, {'ATEN_CPU_CAPABILITY': 'avx2',
                                               'ONEDNN_MAX_CPU_ISA': 'AVX2'}, True),  # emulated
    ('AVX2', {'avx2', 'avx_vnni'}, {}, False),  # oneDNN takes AVX-VNNI (Alder Lake)
    ('AVX2', set(), {}, False),  # flags unknown: the pass runs
    ('DEFAULT', {'sse4_2'}, {}, False),
])
def test_the_avx2_pass_is_left_out_only_where_the_suite_ran_its_kernels(capability, flags, env,
                                                                        already):
    import kernels
    assert bool(kernels.avx2_kernels_already(capability, flags, env)) is already


@pytest.mark.parametrize('already', [True, False])
def test_make_test_runs_the_avx2_pass_unless_the_suite_ran_on_its_kernels(tmp_path, already):
    """``make test``'s commands, each run by a stand-in interpreter that records its arguments and
    the AVX2 variables it got; its ``tests/kernels.py`` answers as ``already`` says."""
    import shutil
    if shutil.which('make') is None:
        pytest.skip('no make on this machine')
    log = tmp_path / 'seen.txt'
    fake = tmp_path / 'python'
    fake.write_text(f'#!/bin/sh\necho "${{ATEN_CPU_CAPABILITY-none}} $*" >> "{log}"\n'
                    f'case "$1" in tests/kernels.py) exit {0 if already else 1} ;; esac\n')
    fake.chmod(0o755)
    # (a make that runs this test passes its command line's variables, `make test-fast
    # TEST_WORKERS=0`, to the make started here in MAKEFLAGS)
    env = {k: v for k, v in os.environ.items()
           if k not in ('ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA', 'VIRTUAL_ENV', 'TEST_WORKERS',
                        'MAKEFLAGS', 'MFLAGS', 'MAKELEVEL', 'MAKEOVERRIDES')}
    res = subprocess.run(['make', '-s', '-o', 'setup', '-o', 'lint', 'test', f'PY={fake}'],
                         cwd=os.path.dirname(TESTS), env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = [line.split() for line in log.read_text().splitlines()]
    suite = ['none', '-m', 'pytest', '-q', '-n', '2', '--dist', 'loadfile',
             '--no-loadscope-reorder', '--durations=20', 'tests']
    avx2 = ['avx2', '-m', 'pytest', '-q', '-m', 'numerics', 'tests']
    assert seen == [suite, ['none', 'tests/kernels.py']] + ([] if already else [avx2]), seen
