"""The one circuit breaker and fork guard every kind's nodes use (time logic under
freezegun; the kinds' own faults are in their integration suites)."""

from __future__ import annotations

import os
import warnings

import pytest
from freezegun import freeze_time

from celery_redlock.core.nodes.guard import BREAKER_MAX, FORKS, Breaker, ProcessLocal


def test_a_timeout_opens_the_breaker_for_its_budget_and_a_reply_closes_it():
    with freeze_time("2026-12-07 12:00:00") as clock:
        breaker = Breaker()
        assert not breaker.skipping()
        breaker.timed_out(0.25)
        assert breaker.skipping() and "within 0.25s" in breaker.why("n1", "connects")
        assert breaker.why("n1").startswith("n1: skipped for a while: its calls timed out")
        with pytest.raises(TimeoutError, match="n1: skipped for a while"):
            breaker.check("n1")
        clock.tick(0.3)
        assert not breaker.skipping()  # the while is over: the next call tries
        breaker.check("n1")
        breaker.answered()
        breaker.timed_out(0.25)
        assert breaker.backoff == 0.25  # closed in between: it starts again


def test_a_try_after_the_while_that_times_out_doubles_it_up_to_the_most():
    with freeze_time("2026-12-07 12:00:00") as clock:
        breaker = Breaker()
        breaker.timed_out(0.3)
        breaker.timed_out(0.3)  # a try made before it opened: no growth
        assert breaker.backoff == 0.3
        for expected in (0.6, BREAKER_MAX, BREAKER_MAX):
            clock.tick(breaker.backoff)
            breaker.timed_out(0.3)
            assert breaker.backoff == expected and breaker.skipping()


def test_one_probe_when_the_while_is_over():
    with freeze_time("2026-12-07 12:00:00") as clock:
        breaker = Breaker()
        breaker.timed_out(0.5)
        assert not breaker.probe_due()
        clock.tick(0.5)
        assert breaker.probe_due() and not breaker.probe_due()  # once
        breaker.timed_out(0.5, probe=True)
        assert breaker.backoff == 1.0 and not breaker.probing
        clock.tick(1.0)
        assert breaker.probe_due()
        breaker.answered(probe=True)
        assert not breaker.backoff and not breaker.probing


def test_a_forked_child_counts_the_fork_and_makes_its_own_value():
    made = ProcessLocal(object)
    parents = made()
    assert made() is parents
    with warnings.catch_warnings():  # Python 3.12+ frowns on fork with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        before = FORKS.count
        pid = os.fork()
    if pid == 0:  # the child: a new count, a new value
        os._exit(0 if FORKS.count == before + 1 and made() is not parents else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert FORKS.count == before and made() is parents
