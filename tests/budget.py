"""The suite's time budget, checked by every run (conftest imports these hooks).

Two rules, both reported at the end of the run's output, naming the test:

- a test marked ``slow`` (the fast tier, ``make test-fast``, is what a change is checked with
  first) says in its docstring what it runs that takes the time; one that does not fails the run;
- a test whose setup and call take more than ``SLOW_S`` seconds of CPU time (its process's and
  that of the processes it started and waited for: a measure that another process sharing the
  cores does not inflate as it does wall time) is marked ``slow``. One over the limit is named;
  one over ``FAIL_FACTOR`` times the limit fails the run. CPU time still varies between runs and
  machines by tens of percent (the two processes share caches and cores, kernels differ between
  CPUs), so a test near the limit names itself in one run and not the next; the factor keeps such
  a test from failing a run it passed before, and a test clearly over fails every run.

``SLOW_S`` holds on a CPU where ``floor_seconds()`` takes ``FLOOR_S`` (a 2-core Intel Xeon VM on
torch's AVX2 kernels, Python 3.10 and 3.13 alike); a slower CPU, timed in the same process, gets
a limit that much longer, never a shorter one. ``DEEPVIT_TEST_SLOW_S`` sets a limit taken as it is
(tests/test_budget.py uses it). ``DEEPVIT_TEST_CPU_CSV=FILE`` writes every test's CPU seconds
(setup and call, its finished children's included) to FILE, the most first: where a suite's work
goes, which wall times (processes sharing the cores) do not tell.
"""
import os
import time

import pytest

SLOW_S = 5.0
FAIL_FACTOR = 2.0
FLOOR_S = 0.05
_KEY = 'budget'
_KEY_OVER = 'budget_over'
_KEY_CPU = 'cpu_seconds'
_CPU = []  # (CPU seconds, test), in the process that reports the run
_START = pytest.StashKey[float]()  # CPU seconds when a test's setup began
_BROKEN = []  # in the process that reports the run (pytest-xdist's sends it every report)
_OVER = []  # tests over the limit, under FAIL_FACTOR times it: named, the run not failed
_FLOOR = []  # this process's floor, timed once (~0.3 s), after its first test


def floor_seconds(repeats: int = 5) -> float:
    """CPU seconds of a fixed piece of work on one thread (small convolutions and a Python loop,
    as the tests mix them), the fastest of ``repeats``."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(1, 32, 56, 56, generator=gen), torch.randn(32, 32, 3, 3, generator=gen)
        best = float('inf')
        for _ in range(repeats):
            start = time.process_time()
            for _ in range(20):
                torch.nn.functional.conv2d(x, w, padding=1).relu_().sum()
            sum(len(str(i)) for i in range(100_000))
            best = min(best, time.process_time() - start)
        return best
    finally:
        torch.set_num_threads(threads)


def slow_limit() -> float:
    """The CPU seconds a test not marked slow may take on this machine."""
    if 'DEEPVIT_TEST_SLOW_S' in os.environ:
        return float(os.environ['DEEPVIT_TEST_SLOW_S'])
    if not _FLOOR:
        _FLOOR.append(floor_seconds())
    return SLOW_S * max(1.0, _FLOOR[0] / FLOOR_S)


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (user + system)."""
    import resource
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_START] = cpu_seconds()


def _broken_rule(item, took: float):
    """What the test does against the rules, as (key, text), or None."""
    slow = item.get_closest_marker('slow') is not None
    doc = getattr(getattr(item, 'function', None), '__doc__', None)
    if slow and not (doc or '').strip():
        return _KEY, f'{item.nodeid} is marked slow and has no docstring saying why'
    if not slow and took > (limit := slow_limit()):
        text = f'{item.nodeid} took {took:.1f} s of CPU (over {limit:.3g} s) and is not marked slow'
        return (_KEY, text) if took > FAIL_FACTOR * limit else (_KEY_OVER, text)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Adds what a test that ran does against the rules to its report (reports travel from
    pytest-xdist's processes to the one that prints)."""
    outcome = yield
    report = outcome.get_result()
    if call.when == 'call' and report.passed and _START in item.stash:
        took = cpu_seconds() - item.stash[_START]
        report.user_properties.append((_KEY_CPU, took))
        broken = _broken_rule(item, took)
        if broken:
            report.user_properties.append(broken)


def pytest_runtest_logreport(report):
    """Gathers what the tests' reports say of the budget."""
    _BROKEN.extend(value for key, value in report.user_properties if key == _KEY)
    _OVER.extend(value for key, value in report.user_properties if key == _KEY_OVER)
    _CPU.extend((value, report.nodeid) for key, value in report.user_properties if key == _KEY_CPU)


def pytest_sessionfinish(session):
    """A test against the rules fails the run; ``DEEPVIT_TEST_CPU_CSV`` gets the CPU times."""
    path = os.environ.get('DEEPVIT_TEST_CPU_CSV')
    if path and _CPU and not hasattr(session.config, 'workerinput'):  # pytest-xdist's workers: no
        with open(path, 'w') as f:
            f.write('cpu_seconds,test\n')
            f.writelines(f'{took:.3f},{test}\n' for took, test in sorted(_CPU, reverse=True))
    if _BROKEN and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Names the tests against the rules, after ``--durations``' table (the end of a log is what
    is read first)."""
    if _BROKEN:
        terminalreporter.section('time budget (tests/budget.py): these fail the run', red=True)
        for line in _BROKEN:
            terminalreporter.line(line)
    if _OVER:
        terminalreporter.section(
            f'time budget (tests/budget.py): over the limit, under {FAIL_FACTOR:g}x it; mark them '
            'slow or make them faster', yellow=True)
        for line in _OVER:
            terminalreporter.line(line)
