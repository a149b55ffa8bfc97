"""``lock_on_duplicate="supersede"`` on a real prefork worker (4 processes) over
three real redis-server lock nodes: the newest call asks the running one to
stop at its next ``check()``, and replaces the calls waiting.

The test app's lock TTL is 2 s, so the heartbeat renews (and looks at the
queue) every 0.67 s. Time bounds are the event's own bound with 3x slack for
a loaded 2-core host.
"""

from __future__ import annotations

import time

import pytest
from celery.exceptions import TaskRevokedError

from tests.support import harness
from tests.support.harness import WorkerHandle, assert_no_overlap, wait_for
from tests.support.queue_tasks import SIGNALS_RUN

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: The heartbeat interval of the test app's tasks: ttl / 3.
BEAT = 2.0 / 3


def revoked_reason(result, timeout: float) -> str:
    with pytest.raises(TaskRevokedError) as info:
        result.get(timeout=timeout)
    return str(info.value)


def test_a_checking_holder_stops_for_a_newer_call(prefork_worker: WorkerHandle):
    """The holder checks its lease every 0.1 s: it stops within about one heartbeat
    interval plus one check (0.77 s; 2.3 s here) of a newer call, ends REVOKED
    naming it, the lock_superseded signal names it too, and the newer call runs
    after it and succeeds."""
    task = prefork_worker.task("superseded_checking")
    run, key = harness.new_run(), f"sc-{harness.new_run()}"
    first = task.delay(key, run, duration=30.0, seq=0)
    wait_for(lambda: prefork_worker.records(run, "start"), 10, "the holder", 0.05)
    sent = time.time()
    newer = task.delay(key, run, duration=0.2, seq=1)
    wait_for(lambda: prefork_worker.records(run, "stopped"), 10, "the holder to stop", 0.05)
    stopped = prefork_worker.records(run, "stopped")[0]
    assert stopped["successor"] == newer.id
    assert stopped["end"] - sent < 3 * (BEAT + 0.1), stopped["end"] - sent
    assert newer.id in revoked_reason(first, 10)
    assert newer.get(timeout=10) == 1
    ended = prefork_worker.records(run, "end")
    assert [r["seq"] for r in ended] == [1] and ended[0]["start"] >= stopped["end"]
    signals = [r for r in prefork_worker.records(SIGNALS_RUN, "signal") if r["id"] == first.id]
    assert [s["successor"] for s in signals] == [newer.id]


def test_a_holder_that_never_checks_finishes_and_the_newest_runs_after_it(
    prefork_worker: WorkerHandle,
):
    """A body that never calls check() runs to its end (SUCCESS); of the calls sent
    meanwhile, the waiting ones are answered REVOKED at once naming the call
    that replaced them (within a second; 3 s here), and the newest runs after
    the holder."""
    task = prefork_worker.task("superseded_plain")
    run, key = harness.new_run(), f"sp-{harness.new_run()}"
    first = task.delay(key, run, duration=1.5, seq=0)
    wait_for(lambda: prefork_worker.records(run, "start"), 10, "the holder", 0.05)
    middle = [task.delay(key, run, duration=0.05, seq=i) for i in (1, 2)]
    newest = task.delay(key, run, duration=0.05, seq=3)
    sent = time.time()
    assert newest.id in revoked_reason(middle[1], 3.0)
    assert middle[1].id in revoked_reason(middle[0], max(0.1, sent + 3.0 - time.time()))
    assert first.get(timeout=10)["token"] > 0
    assert newest.get(timeout=10)["token"] > first.get()["token"]
    runs = prefork_worker.records(run, "end")
    assert sorted(r["seq"] for r in runs) == [0, 3]
    assert_no_overlap(runs)
