"""The suite's time budget, checked by every run (conftest imports these hooks).

A test whose setup and call take more than ``SLOW_S`` seconds of CPU time (its process's and that
of the processes it started and waited for: a measure that another process sharing the cores does
not inflate, as it does wall time) must be marked ``slow`` (the fast tier, ``make test-fast``, is
what a change is checked with first) and must say in its docstring why it takes that long. A run
with a test that breaks either rule fails, naming it and its time. ``DEEPVIT_TEST_SLOW_S`` sets
another limit (tests/test_budget.py uses it).
"""
import os

import pytest

SLOW_S = 5.0
_KEY = 'budget'
_START = pytest.StashKey[float]()  # CPU seconds when a test's setup began
_BROKEN = []  # in the process that reports the run (pytest-xdist's sends it every report)


def slow_limit() -> float:
    return float(os.environ.get('DEEPVIT_TEST_SLOW_S', SLOW_S))


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (user + system)."""
    import resource
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_START] = cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Where a test's setup and call took more CPU time than the limit, adds what is wrong to its
    report (reports travel from pytest-xdist's processes to the one that prints)."""
    outcome = yield
    report = outcome.get_result()
    if call.when == 'call' and report.passed and _START in item.stash:
        took = cpu_seconds() - item.stash[_START]
        limit = slow_limit()
        if took > limit:
            missing = []
            if item.get_closest_marker('slow') is None:
                missing.append('is not marked slow')
            doc = getattr(getattr(item, 'function', None), '__doc__', None)
            if not (doc or '').strip():
                missing.append('has no docstring saying why')
            if missing:
                report.user_properties.append(
                    (_KEY, f'{item.nodeid} took {took:.1f} s of CPU (over {limit:g} s) and '
                           f'{" and ".join(missing)}'))



def pytest_runtest_logreport(report):
    """Gathers what the tests' reports say of the budget."""
    _BROKEN.extend(value for key, value in report.user_properties if key == _KEY)


def pytest_sessionfinish(session):
    """A test over the limit fails the run."""
    if _BROKEN and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    """Names the tests over the limit."""
    if _BROKEN:
        terminalreporter.section('time budget (tests/budget.py)', red=True)
        for line in _BROKEN:
            terminalreporter.line(line)
