"""``lock_on_duplicate="queue"`` on a real prefork worker (4 processes) over three
real redis-server lock nodes: every call of a key runs, one at a time, in
publish order, holding no worker slot while it waits.

The task bodies record their start and end with the call's sequence number
(``tests.support.queue_tasks``). Time bounds are the event's own bound with 3x
slack for a loaded 2-core host.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from celery.exceptions import TaskRevokedError

from tests.support import harness
from tests.support.harness import (
    Topology,
    WorkerHandle,
    assert_no_overlap,
    assert_tokens_increase,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def seqs(runs: list[dict]) -> list[int]:
    """The calls' sequence numbers in the order they started."""
    return [r["seq"] for r in sorted(runs, key=lambda r: r["start"])]


def ends(worker: WorkerHandle, run: str, n: int, timeout: float) -> list[dict]:
    wait_for(lambda: len(worker.records(run, "end")) >= n, timeout, f"{n} ends", 0.2)
    return worker.records(run, "end")


def test_thirty_calls_run_in_publish_order_while_unlocked_work_starts_promptly(
    prefork_worker: WorkerHandle,
):
    """30 calls of one key, 0.1 s each, from one producer: they run in the order
    sent, never two at once, tokens growing; a plain task sent while they wait
    starts within 0.5 s (1.5 s here): the waiting calls hold no worker slot and
    do not spin through the broker (the broker holds one message of the key)."""
    queued = prefork_worker.task("queued")
    run, probe_run = harness.new_run(), harness.new_run()
    results = [queued.delay(f"q-{run}", run, duration=0.1, seq=i) for i in range(30)]
    time.sleep(0.5)  # the queue is busy now
    sent = time.time()
    prefork_worker.task("plain").delay(probe_run)
    wait_for(lambda: prefork_worker.records(probe_run, "start"), 10, "the plain task", 0.05)
    waited = prefork_worker.records(probe_run, "start")[0]["start"] - sent
    assert waited < 1.5, f"an unlocked task waited {waited:.2f}s behind the queue"
    runs = ends(prefork_worker, run, 30, 60)
    assert seqs(runs) == list(range(30))
    assert_no_overlap(runs)
    assert_tokens_increase(runs)
    assert [r.get(timeout=10) for r in results][-1]["token"] == runs[-1]["token"]


def test_four_producers_each_see_their_own_order(prefork_worker: WorkerHandle, topology: Topology):
    """Calls of one key from 4 producer processes at once: all run, once each, never
    overlapping, and each producer's calls in the order it sent them."""
    run = harness.new_run()
    calls = [("queued", f"p-{run}", {"run": run, "duration": 0.02, "seq": i}) for i in range(40)]
    # senders() deals calls[i::4] to producer i: producer i sends i, i + 4, i + 8, ...
    for p in harness.senders(topology, calls, processes=4):
        p.join(60)
        assert p.exitcode == 0
    runs = ends(prefork_worker, run, 40, 60)
    assert sorted(seqs(runs)) == list(range(40))
    assert_no_overlap(runs)
    for producer in range(4):
        mine = [s for s in seqs(runs) if s % 4 == producer]
        assert mine == sorted(mine), f"producer {producer}: {mine}"


def test_a_full_queue_answers_revoked_at_once(prefork_worker: WorkerHandle):
    """lock_queue_max=5, a 2 s holder and 19 more calls: the holder and 5 waiting
    calls run (6), 14 are answered REVOKED at once (within a second; 3 s here)."""
    task = prefork_worker.task("queued_max")
    run, key = harness.new_run(), f"max-{harness.new_run()}"
    first = task.delay(key, run, duration=2.0, seq=0)
    wait_for(lambda: prefork_worker.records(run, "start"), 10, "the holder", 0.05)
    sent = [(time.time(), task.delay(key, run, duration=0.05, seq=i)) for i in range(1, 20)]
    revoked = []
    for at, result in sent:
        try:
            result.get(timeout=max(0.1, at + 3.0 - time.time()))
        except TaskRevokedError as exc:
            reason = str(exc)
            assert "lock_queue_max=5" in reason and "queue of 'lockapp.queued_max:" in reason
            revoked.append(result.id)
        except Exception:  # noqa: BLE001 - a call still waiting its turn: not answered
            pass
    assert len(revoked) == 14, len(revoked)
    assert first.get(timeout=10)
    runs = ends(prefork_worker, run, 6, 30)
    time.sleep(0.5)
    runs = prefork_worker.records(run, "end")
    assert seqs(runs) == [0, 1, 2, 3, 4, 5]
    assert_no_overlap(runs)


def test_a_killed_holder_hands_the_queue_on_in_order(prefork_worker: WorkerHandle):
    """The holder's pool process is SIGKILLed mid-run: the worker's main process
    releases its key and hands it to the next call; the rest run in order."""
    task = prefork_worker.task("queued")
    run, key = harness.new_run(), f"kill-{harness.new_run()}"
    task.delay(key, run, duration=30.0, seq=0)
    wait_for(lambda: prefork_worker.records(run, "start"), 10, "the holder", 0.05)
    victim = prefork_worker.records(run, "start")[0]
    for i in range(1, 8):
        task.delay(key, run, duration=0.05, seq=i)
    time.sleep(0.3)
    killed = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    runs = ends(prefork_worker, run, 7, 30)
    assert seqs(runs) == list(range(1, 8))
    assert_no_overlap(runs)
    first = min(r["start"] for r in runs)
    assert first - killed < 6.0, f"the next call started {first - killed:.2f}s after the kill"


def test_retry_from_the_body_goes_to_the_back(prefork_worker: WorkerHandle):
    """A queued body that calls self.retry() lets the key go to the next call; its
    retry parks behind the calls already waiting."""
    task = prefork_worker.task("queued_retry")
    run, key = harness.new_run(), f"retry-{harness.new_run()}"
    results = [task.delay(key, run, duration=0.2, seq=i) for i in range(4)]
    assert [r.get(timeout=30) for r in results] == [0, 1, 2, 3]
    runs = ends(prefork_worker, run, 5, 30)
    assert seqs(runs) == [0, 1, 2, 3, 0]
    assert_no_overlap(runs)


def test_a_handed_call_kept_out_by_a_lock_also_limit_keeps_its_place(
    prefork_worker: WorkerHandle,
):
    """Two keys share a lock_also limit of 1: a call of the second key, handed its
    free key while the first key's call holds the limit, is re-published with
    the lock's backoff, its claim standing, and the second key's calls still run
    in publish order, never two at once across the keys."""
    task = prefork_worker.task("queued_also")
    run = harness.new_run()
    task.delay(f"a-{run}", run, duration=1.0, seq=0)
    wait_for(lambda: prefork_worker.records(run, "start"), 10, "the first key", 0.05)
    for i in range(1, 5):
        task.delay(f"b-{run}", run, duration=0.05, seq=i)
    runs = ends(prefork_worker, run, 5, 30)
    assert seqs(runs) == [0, 1, 2, 3, 4]
    assert_no_overlap(runs)


def test_a_rated_queue_keeps_its_order_and_its_rate(prefork_worker: WorkerHandle):
    """lock_rate 5/s on a queued key: 10 calls sent at once run in publish order,
    at most 5 + 1 in any second (the rate's bound with burst 1)."""
    task = prefork_worker.task("queued_rated")
    run, key = harness.new_run(), f"rq-{harness.new_run()}"
    for i in range(10):
        task.delay(key, run, seq=i)
    runs = ends(prefork_worker, run, 10, 30)
    assert seqs(runs) == list(range(10))
    starts = sorted(r["start"] for r in runs)
    most = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)
    assert most <= 6, most
    assert starts[-1] - starts[0] >= 9 / 5 - 0.5  # paced, not all at once
