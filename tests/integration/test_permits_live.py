"""Permits (``lock_limit``) on a real prefork worker: the limit is respected and used.

The task bodies record start and end times (``tests.support.lockapp``); the
tests count, from those records, how many executions of one key overlapped.
"""

from __future__ import annotations

import pytest

from celery_redlock import plan_of
from tests.support.harness import Topology, WorkerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(autouse=True)
def _no_lock_left_behind(topology: Topology):
    """After every test, no lock or permit key stays on any quorum node."""
    yield
    topology.assert_no_lock_keys()


def held_until(run: dict) -> float:
    """When a run stopped holding its permit: its end, or its lease's validity if
    that ran out first (a heartbeat starved past the TTL, which the worker logs as
    the lease lost: then another call may take the permit while the body goes on,
    its fencing token stale)."""
    return run["end"] + min(0.0, run["remaining"])


def concurrency(runs: list[dict]) -> tuple[int, dict[int, float]]:
    """The most executions holding a permit at once, and the seconds at each level."""
    events = sorted([(r["start"], 1) for r in runs] + [(held_until(r), -1) for r in runs])
    level = peak = 0
    spent: dict[int, float] = {}
    for (at, step), (after, _) in zip(events, events[1:] + events[-1:]):
        level += step
        peak = max(peak, level)
        spent[level] = spent.get(level, 0.0) + (after - at)
    return peak, spent


def short_of(runs: list[dict], limit: int) -> list[tuple[float, float]]:
    """The stretches, between the first time ``limit`` ran at once and the last start,
    with fewer running: each a permit freed while calls still waited for one. Each
    comes with the lock round of the start that ended it (its ``round``: that start's
    attempt began that much before its body, on a loaded host well past a quiet one's)."""
    events = sorted(
        [(r["start"], 1, r) for r in runs] + [(r["end"], -1, r) for r in runs],
        key=lambda e: (e[0], e[1]),
    )
    last_start = max(r["start"] for r in runs)
    level, full_once, since, out = 0, False, None, []
    for at, step, run in events:
        if at > last_start:
            break
        level += step
        if level >= limit:
            full_once = True
            if since is not None:
                out.append((at - since, run["round"]))
                since = None
        elif full_once and since is None:
            since = at
    if since is not None:
        last = max(runs, key=lambda r: r["start"])
        out.append((last_start - since, last["round"]))
    return out


def node_trouble(worker: WorkerHandle, name: str, results: list) -> int:
    """How many releases of ``name`` missed a quorum, and rounds of ``results`` found
    none, by the worker's log (a prefork worker's file; none kept for threads)."""
    if worker.process is None:
        return 0
    ids = {r.id for r in results}
    with open(worker.process.logfile) as f:
        return sum(
            ("release of '" in line and name in line and "did not reach" in line)
            or ("lock nodes unavailable" in line and any(i in line for i in ids))
            for line in f
        )


#: Longer than an acquire round and the record push after it, even on a loaded host
#: (a child descheduled between its grant and its start record passed 0.5 s beside
#: two busy loops: 3x that).
ROUND = 1.5


def assert_tokens_grow_in_grant_order(runs: list[dict]) -> None:
    """A run granted (its start recorded) before another's acquire began has a smaller token.

    Grants that overlap in time have no order to keep; ``start`` is recorded
    after the grant, so a run that started more than one round later began its
    acquire after the earlier grant was done.
    """
    for a in runs:
        for b in runs:
            if a["start"] + ROUND < b["start"]:
                assert a["token"] < b["token"], (a, b)


def test_limit_3_twenty_tasks_under_retry(prefork_worker: WorkerHandle, run: str):
    """K = 3, 20 same-key tasks: all run, never more than 3 at once, tokens distinct and
    growing in grant order, and the limit used: a permit freed while calls wait is
    taken again within a retry's longest backoff and a round (a loaded host
    stretches deliveries, so a share of the run's wall time at 3 is no property)."""
    task = prefork_worker.task("permit3")
    assert plan_of(task).settings.limit == 3
    results = [task.apply_async((run, run), {"duration": 1.0}) for _ in range(20)]
    for result in results:
        result.get(timeout=120)
    ran = prefork_worker.records(run)
    assert sorted(r["id"] for r in ran) == sorted(r.id for r in results)
    peak, spent = concurrency(ran)
    total = max(r["end"] for r in ran) - min(r["start"] for r in ran)
    full = spent.get(3, 0.0) / total
    print(f"\npermits: 20 runs in {total:.2f}s, {full:.0%} of it with 3 running, {spent}")
    assert peak == 3, f"more than 3 at once: {spent}"
    settings = plan_of(task).settings
    # a release that missed a quorum (a node timeout on a loaded host, which the worker
    # logs) leaves its permit held there to its TTL, and a round without a quorum
    # puts its call off: each such event the worker logged allows one TTL more; and
    # the start that ends a stretch began its round that start's own round earlier
    missed = node_trouble(prefork_worker, plan_of(task).keys.build((run, run), {}), results)
    # a starved host fires the waiting calls' retry timers late, as it wakes the bodies
    # late from their 1 s sleeps: 3x the longest oversleep measured in this run
    overslept = max(r["end"] - r["start"] - 1.0 for r in ran)
    allowed = settings.retry_backoff_max + ROUND + settings.ttl * missed + 3 * overslept
    gaps = short_of(ran, 3)
    assert all(gap <= allowed + d for gap, d in gaps), (
        f"the limit is unused: {gaps}, {missed} missed, {overslept:.2f}s overslept"
    )
    tokens = [r["token"] for r in sorted(ran, key=lambda r: r["start"])]
    assert len(set(tokens)) == 20, tokens
    assert_tokens_grow_in_grant_order(ran)
    assert {r["permit"] for r in ran} == {0, 1, 2}
    assert all(r["token"] == r["lease_token"] for r in ran)


def test_named_limit_of_2_shared_by_three_tasks(prefork_worker: WorkerHandle, run: str):
    tasks = [prefork_worker.task(f"named_{letter}") for letter in "abc"]
    results = [tasks[i % 3].apply_async((f"{run}-{i}", run), {"duration": 0.4}) for i in range(12)]
    for result in results:
        result.get(timeout=120)
    ran = prefork_worker.records(run)
    assert len(ran) == 12 and {r["task"] for r in ran} == {f"lockapp.named_{x}" for x in "abc"}
    peak, spent = concurrency(ran)
    print(f"\nnamed limit 2: {spent}")
    assert peak == 2, spent
    assert len({r["lease_key"] for r in ran}) == 2  # two permits of the one name
    tokens = [r["token"] for r in ran]
    assert len(set(tokens)) == len(tokens)


def test_per_key_lock_and_named_limit_together_200_mixed_tasks(
    prefork_worker: WorkerHandle, run: str
):
    """150 tasks over 5 keys, each holding its key and the named limit "crl-api" (2)
    together, mixed with 50 tasks holding the named limit alone: all run (no
    deadlock), never two of a key at once, never more than 2 in the named limit."""
    both, alone = prefork_worker.task("key_and_api"), prefork_worker.task("api_only")
    # the name lock_also resolves to is the one a lock_on=() task of that lock_name builds
    assert plan_of(both).also == ((plan_of(alone).keys.build(("any", run), {}), 2),)
    results = []
    for i in range(200):
        if i % 4 == 3:
            results.append(alone.apply_async((f"{run}-alone", run), {"duration": 0.02}))
        else:
            results.append(both.apply_async((f"{run}-{i % 5}", run), {"duration": 0.02}))
    for result in results:
        result.get(timeout=170)
    ran = prefork_worker.records(run)
    assert sorted(r["id"] for r in ran) == sorted(r.id for r in results)
    api_peak, api_spent = concurrency(ran)
    assert len({r["api_key"] for r in ran}) == 2, "two permits of one name, for both tasks"
    assert api_peak <= 2, api_spent
    for i in range(5):
        peak, spent = concurrency([r for r in ran if r["key"] == f"{run}-{i}"])
        assert peak == 1, (i, spent)
    print(f"\nkey + named limit: 200 tasks, named limit levels {api_spent}")
