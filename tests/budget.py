"""The suite's time budget, checked by every run (conftest imports these hooks).

A test whose setup and call take longer than ``SLOW_S`` seconds must be marked ``slow`` (the fast
tier, ``make test-fast``, is what a change is checked with in a minute) and must say in its
docstring why it takes that long. A run with a test that breaks either rule fails, naming it and
its time. ``DEEPVIT_TEST_SLOW_S`` sets another limit (the tests of this file use it).
"""
import os

import pytest

SLOW_S = 5.0
_KEY = 'budget'


def slow_limit() -> float:
    return float(os.environ.get('DEEPVIT_TEST_SLOW_S', SLOW_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Adds a test's setup time to its call and, where the two exceed the limit, what is wrong
    to its report (reports travel from pytest-xdist's processes to the one that prints)."""
    outcome = yield
    report = outcome.get_result()
    if call.when == 'setup':
        item.stash[_SETUP] = call.duration
    elif call.when == 'call' and report.passed:
        took = item.stash.get(_SETUP, 0.0) + call.duration
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
                    (_KEY, f'{item.nodeid} took {took:.1f} s (over {limit:g} s) and '
                           f'{" and ".join(missing)}'))


_SETUP = pytest.StashKey[float]()
_BROKEN = []  # in the process that reports the run (pytest-xdist's sends it every report)


def pytest_runtest_logreport(report):
    """Gathers what the tests' reports say of the budget."""
    _BROKEN.extend(value for key, value in report.user_properties if key == _KEY)


def pytest_sessionfinish(session):
    """A test over the limit fails the run."""
    if _BROKEN and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    """Names the tests over the limit."""
    broken = _BROKEN
    if broken:
        terminalreporter.section('time budget (tests/budget.py)', red=True)
        for line in broken:
            terminalreporter.line(line)
