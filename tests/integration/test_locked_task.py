"""LockedTask end to end: real workers (prefork subprocess and in-process threads), real Redis.

Every task body records what it saw (see ``tests.support.lockapp``); the tests judge the
recorded runs: who ran, when, with which fencing token, and what the
duplicates answered. Timing figures are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
from celery import Celery, current_task, states
from celery.exceptions import ImproperlyConfigured, SoftTimeLimitExceeded, TaskRevokedError

from celery_redlock import ConfigurationError, Lease, LockedTask, current_lease, metrics, plan_of
from celery_redlock.core.held import LAPSED, NO_QUORUM, TOO_LATE
from celery_redlock.redlock import make_owner
from tests.support.harness import (
    Topology,
    WorkerHandle,
    assert_no_overlap,
    assert_tokens_increase,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def _no_lock_left_behind(topology: Topology):
    """After every test, no lock key stays on any quorum node."""
    yield
    topology.assert_no_lock_keys()


def _watch(results: list, timeout: float, until: Any = None) -> dict[str, tuple[str, float]]:
    """Poll the results until all are ready, or ``until(seen)`` holds: task id ->
    (state, time.time() first seen ready)."""
    seen: dict[str, tuple[str, float]] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(results) and not (until and until(seen)):
        for result in results:
            if result.id not in seen:
                state = result.state
                if state in states.READY_STATES:
                    seen[result.id] = (state, time.time())
        if time.monotonic() > deadline:
            missing = {r.id: r.state for r in results if r.id not in seen}
            raise AssertionError(f"results not ready after {timeout}s: {missing}")
        time.sleep(0.02)
    return seen


# -- 1. contention policies on a real worker ---------------------------------------


def test_drop_runs_once_and_duplicates_answer_at_once(policy_worker: WorkerHandle, run: str):
    """20 same-key tasks under drop: one runs, 19 are REVOKED naming it, well before it ends.

    The one that runs holds its key until the 19 are answered (a loaded host may
    deliver one later than a fixed run would last, and a delivery after the
    holder's end rightly runs): the latencies bound how soon they were answered."""
    slow = policy_worker.task("slow")
    go_key = f"{run}:go"
    sent_at, results = {}, []
    for _ in range(20):
        result = slow.apply_async((run, run), {"duration": 30.0, "go_key": go_key})
        sent_at[result.id] = time.time()
        results.append(result)

    def dropped_all(seen: dict) -> bool:
        return sum(state == states.REVOKED for state, _ in seen.values()) >= 19

    with policy_worker.topology.recorder() as client:
        try:
            seen = _watch(results, timeout=20, until=dropped_all)
        finally:
            client.set(go_key, 1, ex=60)
    seen.update(_watch([r for r in results if r.id not in seen], timeout=20))

    ran = policy_worker.records(run)
    assert len(ran) == 1, f"expected exactly one execution, got {ran}"
    holder = ran[0]
    assert seen[holder["id"]][0] == states.SUCCESS
    dropped = [r for r in results if r.id != holder["id"]]
    assert len(dropped) == 19
    latencies = []
    for result in dropped:
        state, ready_at = seen[result.id]
        assert state == states.REVOKED
        latencies.append(ready_at - sent_at[result.id])
        # the duplicate was answered while the holder's body was still running
        assert ready_at < holder["end"], (
            "a duplicate was answered only after the holder's body ended"
        )
        started = time.monotonic()
        with pytest.raises(TaskRevokedError, match=holder["id"]) as info:
            result.get(timeout=5)
        # answered from the stored REVOKED state, not by waiting out the 5 s timeout
        assert time.monotonic() - started < 4.0
        assert "lock held by task" in str(info.value)
    # the behaviour is ready_at < holder["end"] above; this only bounds the outliers
    assert max(latencies) < 5.0, latencies
    print(
        f"\n[{policy_worker.kind}] drop: 19 duplicates REVOKED after "
        f"{min(latencies):.3f}-{max(latencies):.3f}s "
        f"(holder body {holder['end'] - holder['start']:.2f}s)"
    )


def test_retry_runs_every_task_in_turn_without_using_max_retries(
    policy_worker: WorkerHandle, run: str
):
    """20 same-key tasks under retry, max_retries=0: all run, one at a time, tokens increasing."""
    task = policy_worker.task("slow_retry")
    assert task.max_retries == 0
    started = time.monotonic()
    results = [task.apply_async((run, run)) for _ in range(20)]
    for result in results:
        assert result.get(timeout=90)["token"] > 0
    elapsed = time.monotonic() - started

    ran = policy_worker.records(run)
    assert sorted(r["id"] for r in ran) == sorted(r.id for r in results), (
        "each task must run exactly once"
    )
    assert_no_overlap(ran)
    assert_tokens_increase(ran)
    assert all(r["token"] == r["lease_token"] for r in ran)
    # contention retries went through the lock's own attempt counter, not request.retries:
    # with max_retries=0 a single counted retry would have failed the task
    assert all(r["retries"] == 0 for r in ran)
    attempts = sorted(r["attempt"] for r in ran)
    assert sum(1 for a in attempts if a > 0) >= 3, attempts
    # the token is never part of the message, first delivery or re-published
    assert all("fencing_token" not in r["kwargs"] for r in ran)
    print(
        f"\n[{policy_worker.kind}] retry: 20 runs in {elapsed:.2f}s, "
        f"lock attempts per task {attempts}"
    )


def test_raise_fails_the_duplicate_with_lock_contended(policy_worker: WorkerHandle, run: str):
    """Under raise, a duplicate fails at once with LockContended naming the holder."""
    task = policy_worker.task("slow_raise")
    holder = task.apply_async((run, run), {"duration": 2.0})
    wait_for(lambda: policy_worker.records(run, "start"), 15, "the holder to start")
    duplicates = [task.apply_async((run, run)) for _ in range(3)]
    for duplicate in duplicates:
        with pytest.raises(Exception) as info:  # noqa: PT011 - the type is checked below
            duplicate.get(timeout=10)
        # Celery rebuilds it as a plain Exception naming the class (not an allowed module)
        assert "LockContended" in repr(info.value), repr(info.value)
        assert holder.id in str(info.value)
        assert duplicate.state == states.FAILURE
        assert "celery_redlock.exceptions.LockContended" in duplicate.traceback
    assert holder.get(timeout=15)["token"] > 0
    assert [r["id"] for r in policy_worker.records(run)] == [holder.id]


def test_wait_runs_every_duplicate_in_turn_on_the_same_delivery(
    policy_worker: WorkerHandle, run: str
):
    """Under wait, duplicates poll in their worker slot and run one after the other."""
    task = policy_worker.task("slow_wait")
    results = [task.apply_async((run, run), {"duration": 0.4}) for _ in range(3)]
    for result in results:
        assert result.get(timeout=30)["token"] > 0
    ran = policy_worker.records(run)
    assert sorted(r["id"] for r in ran) == sorted(r.id for r in results)
    assert_no_overlap(ran)
    assert_tokens_increase(ran)
    # waited in place: no re-publish, no retry
    assert all(r["attempt"] == 0 and r["retries"] == 0 for r in ran)


class _Lines(logging.Handler):
    """The records of one logger, as text (the in-process worker logs in this process)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def test_retry_that_runs_out_fails_loudly(worker: WorkerHandle, run: str):
    """Retries spent behind a holder: FAILURE with LockContended by default (REVOKED with
    lock_on_exhausted="drop"), either way an ERROR naming the task, the key and the holder,
    and the gave_up count."""
    task = worker.task("retry_brief")
    plan = plan_of(task)
    name = plan.keys.build((run, run), {})
    lease = plan.redlock.try_acquire(name, ttl=60, owner=make_owner("the-holder", 0))
    assert isinstance(lease, Lease)
    lines = _Lines()
    logging.getLogger("celery_redlock.policies").addHandler(lines)
    before = metrics.snapshot().get("gave_up", {}).get("crl-give-up", 0)
    try:
        failed = task.apply_async((run, run))
        with pytest.raises(Exception) as info:  # noqa: PT011 - the type is checked below
            failed.get(timeout=30)
        assert "LockContended" in repr(info.value) and "the-holder" in str(info.value)
        assert failed.state == states.FAILURE
        dropped = worker.task("retry_brief_drop").apply_async((run, run))
        with pytest.raises(TaskRevokedError, match="gave up after 2 retries"):
            dropped.get(timeout=30)
    finally:
        logging.getLogger("celery_redlock.policies").removeHandler(lines)
        plan.redlock.release(lease)
    assert worker.records(run) == []
    if worker.process is not None:  # prefork: the worker's log file
        with open(worker.process.logfile) as f:
            log = [line for line in f if "gave up on lock" in line]
    else:  # threads: this process, where the count is kept too
        log = [line for line in lines.lines if "gave up on lock" in line]
        assert metrics.snapshot()["gave_up"]["crl-give-up"] == before + 2
    for result, outcome in ((failed, "failing with LockContended"), (dropped, "dropped")):
        mine = [line for line in log if f"[{result.id}]" in line]
        assert len(mine) == 1, log
        assert "ERROR" in mine[0] and f"gave up on lock {name} after 2 retries" in mine[0]
        assert "lock held by task the-holder on " in mine[0] and outcome in mine[0]


def test_different_lock_on_values_run_in_parallel(worker: WorkerHandle, run: str):
    slow = worker.task("slow")
    go_key = f"{run}:go"  # each holds until all four ran at once (or the wait gave up)
    calls = [{"duration": 30.0, "go_key": go_key}] * 4
    results = [slow.apply_async((f"{run}-{i}", run), kw) for i, kw in enumerate(calls)]
    try:
        wait_for(lambda: len(worker.records(run, "start")) == 4, 20, "four keys held at once")
    finally:
        with worker.topology.recorder() as client:
            client.set(go_key, 1, ex=60)
    for result in results:
        result.get(timeout=20)
    ran = worker.records(run)
    assert len(ran) == 4
    assert len({r["lease_key"] for r in ran}) == 4
    latest_start = max(r["start"] for r in ran)
    earliest_end = min(r["end"] for r in ran)
    assert latest_start < earliest_end, "executions of different keys should overlap in time"


def test_a_lock_on_mapping_makes_a_string_and_an_int_one_key(
    prefork_worker: WorkerHandle, run: str
):
    """``lock_on={"order_id": int}``: ``"7"`` (from a web form) and ``7`` contend;
    with ``lock_on=("key",)`` the same two values are two locks and run side by side."""
    order = uuid.uuid4().int % 10**12
    by_order, slow = prefork_worker.task("by_order"), prefork_worker.task("slow")
    first = by_order.apply_async((str(order), run), {"duration": 2.0})
    wait_for(lambda: prefork_worker.records(run, phase="start"), 20, "the first start")
    second = by_order.apply_async((order, run), {"duration": 0.0})
    with pytest.raises(TaskRevokedError, match=first.id):
        second.get(timeout=20)
    first.get(timeout=20)
    assert [r["id"] for r in prefork_worker.records(run)] == [first.id]

    apart = f"{run}-apart"
    results = [slow.apply_async((key, apart), {"duration": 1.5}) for key in (str(order), order)]
    for result in results:
        result.get(timeout=20)
    ran = prefork_worker.records(apart)
    assert len(ran) == 2 and len({r["lease_key"] for r in ran}) == 2
    assert max(r["start"] for r in ran) < min(r["end"] for r in ran)


def test_the_release_is_not_waited_for_yet_lands_before_the_next_run(
    worker: WorkerHandle, run: str, topology: Topology
):
    """The worker writes the release and stores the result without waiting for the
    nodes' replies: the key is gone from every node right after, and a same-key task
    sent once the previous one's result is in runs (under ``drop``), every time."""
    slow = worker.task("slow")
    for _ in range(10):
        result = slow.apply_async((run, run), {"duration": 0.0})
        result.get(timeout=10)
        assert result.state == states.SUCCESS
        topology.assert_no_lock_keys(timeout=2)
    ran = worker.records(run)
    assert len(ran) == 10, f"a run was dropped: {len(ran)} of 10 ran"
    assert_tokens_increase(ran)


def test_lock_name_shared_by_two_tasks_excludes_across_them(worker: WorkerHandle, run: str):
    shared_a, shared_b = worker.task("shared_a"), worker.task("shared_b")
    go_key = f"{run}:go"  # the holder holds until the duplicate's fate is known, however late
    holder = shared_a.apply_async((run, run), {"duration": 30.0, "go_key": go_key})
    wait_for(lambda: worker.records(run, "start"), 10, "shared_a to start")
    try:
        duplicate = shared_b.apply_async((run, run))
        with pytest.raises(TaskRevokedError, match=holder.id):
            duplicate.get(timeout=10)
        other_key = shared_b.apply_async((f"{run}-other", run))  # same lock name, another key
        other_key.get(timeout=10)
    finally:
        with worker.topology.recorder() as client:
            client.set(go_key, 1, ex=60)
    holder.get(timeout=10)

    ran = {r["id"]: r for r in worker.records(run)}
    assert set(ran) == {holder.id, other_key.id}
    assert ran[other_key.id]["start"] < ran[holder.id]["end"]  # not held up by the other key
    assert ran[holder.id]["lease_key"].startswith(f"{worker.topology.prefix}:lock:crl-shared:")


# -- 2. heartbeat ---------------------------------------------------------------------


def test_heartbeat_keeps_the_lock_three_times_past_its_ttl(worker: WorkerHandle, run: str):
    task = worker.task("heartbeat_long")
    ttl = plan_of(task).settings.ttl
    holder = task.apply_async((run, run), {"duration": 3 * ttl})
    first = wait_for(lambda: worker.records(run, "start"), 10, "the long task to start")[0]

    # Duplicates all through the run, stopping a little before its end (a duplicate
    # that arrives after the holder released would rightly run).
    duplicates = []
    while time.time() < first["start"] + 3 * ttl - 0.6:
        duplicates.append((time.time(), task.apply_async((run, run), {"duration": 0.1})))
        time.sleep(0.2)
    holder.get(timeout=3 * ttl + 30)  # its end is checked below; on a loaded host it came late

    # Every duplicate is dropped naming the holder, but one whose round found no
    # quorum (a node timeout on a loaded host) is retried, never dropped, by design:
    # retried past the holder's release, it rightly runs, after the holder.
    outcomes, dropped_for = {}, {}
    for _, duplicate in duplicates:
        try:
            duplicate.get(timeout=5)
            outcomes[duplicate.id] = "ran"
        except TaskRevokedError as exc:
            # the holder, or a retried duplicate that ran after it (checked below)
            named = next(i for i in [holder.id, *(d.id for _, d in duplicates)] if i in str(exc))
            outcomes[duplicate.id] = "dropped"
            dropped_for[duplicate.id] = named
    ran = sorted(worker.records(run), key=lambda r: r["start"])
    assert set(dropped_for.values()) <= {r["id"] for r in ran}, "each drop names a run"
    assert ran[0]["id"] == holder.id, "the holder ran first"
    end = ran[0]
    later = ran[1:]
    assert {r["id"] for r in later} == {i for i, o in outcomes.items() if o == "ran"}
    for r in later:
        if end["lost"]:
            # given up by a host too loaded to renew it in time (checked below): the
            # name was free from then on, and a later run holds a larger token
            assert r["token"] > end["token"], (r, end)
            continue
        # never while the holder ran; retried after an outage, or a message a busy
        # host delivered after the holder's release (it rightly runs then)
        assert r["start"] >= end["end"], (r, end)
    assert end["end"] - end["start"] >= 3 * ttl
    # Kept, unless the host was too loaded to renew it in time (a renewal round that
    # found no quorum in time, or a heartbeat thread that woke after the validity ran
    # out: the heartbeat then gives the lease up at once, by design); never lost
    # because its key was freed or taken, and no later run started while it ran (above).
    assert end["lost"] is False or end["lost_reason"] in (NO_QUORUM, LAPSED, TOO_LATE), end
    assert end["remaining"] > 0 or end["lost"]
    # duplicates were sent (and dropped) in every TTL period of the run
    for period in range(3):
        lo, hi = end["start"] + period * ttl, end["start"] + (period + 1) * ttl
        assert any(lo <= sent < hi for sent, _ in duplicates), f"no duplicate in [{lo}, {hi})"
    print(
        f"\n[{worker.kind}] heartbeat: held {end['end'] - end['start']:.2f}s on a {ttl}s TTL, "
        f"{list(outcomes.values()).count('dropped')} of {len(duplicates)} duplicates dropped, "
        f"{end['remaining']:.2f}s left at the end"
    )


# -- 7. the body: token, kwargs, outcomes -------------------------------------------


def test_current_lease_in_an_unbound_task(worker: WorkerHandle, run: str):
    token = worker.task("unbound_probe").delay(run, run).get(timeout=10)
    [seen] = worker.records(run)
    assert seen["lease_token"] == seen["token"] == token
    assert seen["lost"] is False
    assert seen["lease_key"].startswith(f"{worker.topology.prefix}:lock:lockapp.unbound_probe:")


def test_user_retry_releases_and_the_token_stays_out_of_kwargs(worker: WorkerHandle, run: str):
    result = worker.task("user_retry").apply_async((run, run))
    assert result.get(timeout=15) == "retried once"
    ran = worker.records(run)
    assert [r["retries"] for r in ran] == [0, 1]
    assert_tokens_increase(ran)
    for r in ran:
        assert r["token"] == r["lease_token"]
        assert "fencing_token" not in r["kwargs"], "the token leaked into the retry message"


def test_exception_in_the_body_releases(worker: WorkerHandle, run: str, topology: Topology):
    result = worker.task("boom").apply_async((run, run))
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=10)
    assert worker.records(run)  # it did run, under the lock
    assert not any(topology.lock_keys().values())  # released before the failure was stored


def test_ignore_in_the_body_releases(worker: WorkerHandle, run: str, topology: Topology):
    result = worker.task("user_ignore").apply_async((run, run))
    wait_for(lambda: worker.records(run), 10, "the body to run")
    topology.assert_no_lock_keys(timeout=2)
    assert result.state == states.PENDING  # Ignore stores nothing


def test_soft_time_limit_releases(prefork_worker: WorkerHandle, run: str, topology: Topology):
    result = prefork_worker.task("soft_limited").apply_async((run, run))
    with pytest.raises(SoftTimeLimitExceeded):
        result.get(timeout=15)
    assert prefork_worker.records(run, "start") and not prefork_worker.records(run, "end")
    assert not any(topology.lock_keys().values())


# -- 7. eager mode and configuration -------------------------------------------------


@pytest.fixture
def eager_app(topology: Topology) -> Celery:
    app = Celery("eager", set_as_current=False)
    app.conf.update(
        task_always_eager=True,
        redlock_nodes=topology.quorum.urls,
        redlock_key_prefix=topology.prefix,
        redlock_ttl=2.0,
    )
    return app


def test_eager_runs_through_the_lock(eager_app: Celery):
    seen = []

    @eager_app.task(base=LockedTask, bind=True, shared=False, lock_on=("key",))
    def work(self, key, fencing_token=None):
        lease = self.request.redlock
        seen.append(
            {
                "token": fencing_token,
                "lease": lease,
                "holder": lease.redlock.holder(lease.name).owner,
                "kwargs": dict(self.request.kwargs or {}),
                "current": current_lease() is lease,
            }
        )
        return fencing_token

    first = work.delay("a")  # task_always_eager
    second = work.apply(("a",))  # explicit eager
    assert first.successful() and second.successful()
    for item in seen:
        assert isinstance(item["token"], int) and item["token"] == item["lease"].fencing_token
        assert item["holder"] == item["lease"].owner  # the quorum held it while the body ran
        assert "fencing_token" not in item["kwargs"]
        assert item["current"]
    assert first.result < second.result


def test_token_is_on_a_quorum_before_the_body_or_at_the_first_read(
    eager_app: Celery, topology: Topology
):
    """A task whose ``run`` takes ``fencing_token`` has it on a quorum before the body:
    with the acquire when the nodes agree, written back when one node is ahead (it saw
    grants the others missed). One whose ``run`` does not moves no fence value until the
    first read of ``current_lease().fencing_token``, which issues it on a quorum. Tokens
    grow across both tasks."""
    seen = []

    def fences(lease):
        return [node.get("fence") for node in lease.redlock.inspect(lease.name)]

    @eager_app.task(base=LockedTask, shared=False, lock_on=(), lock_name="lazy-mixed")
    def lazy():
        lease = current_lease()
        before = fences(lease)
        token = lease.fencing_token
        seen.append(("lazy", token, before, fences(lease)))
        return token

    @eager_app.task(base=LockedTask, shared=False, lock_on=(), lock_name="lazy-mixed")
    def eager(fencing_token=None):
        seen.append(("eager", fencing_token, fences(current_lease()), None))
        return fencing_token

    def put_first_node_ahead():
        fence_key = plan_of(eager).redlock.keys(plan_of(eager).keys.build((), {}))[1]
        with topology.quorum[0].client() as client:
            ahead = int(client.get(fence_key)) + 1000
            client.set(fence_key, str(ahead))

    tokens = []
    for i in range(8):
        if i >= 4:
            put_first_node_ahead()
        tokens.append((lazy if i % 2 else eager).delay().get())
    assert all(isinstance(t, int) for t in tokens)
    assert all(y > x for x, y in zip(tokens, tokens[1:])), tokens
    for kind, token, before, after in seen:
        everywhere = [str(token)] * len(before)
        if kind == "eager":  # the nodes agreed, or phase 2 ran before the body
            assert before == everywhere
        else:  # the lazy lease issued its token at the read, not before
            assert str(token) not in before
            assert after == everywhere


def test_eager_apply_with_a_reused_id_computes_its_result(eager_app: Celery):
    """An eager call is never a copy: a receipt of its id does not stop it."""
    ran = []

    @eager_app.task(base=LockedTask, bind=True, shared=False, lock_on=("key",))
    def add(self, key, x, y, fencing_token=None):
        ran.append(fencing_token)
        return x + y

    task_id = uuid.uuid4().hex
    first = add.apply(("a", 1, 1), task_id=task_id)
    second = add.apply(("a", 2, 3), task_id=task_id)
    assert first.get() == 2 and second.get() == 5
    assert second.state == states.SUCCESS
    assert len(ran) == 2 and ran[0] < ran[1]


def test_a_direct_call_is_celerys_own(eager_app: Celery):
    """``who(7)``: the task's request carries the call's arguments and the task is the
    current task, as in plain Celery; no lock is taken."""
    seen = []

    @eager_app.task(base=LockedTask, bind=True, shared=False, lock_on=("x",))
    def who(self, x, fencing_token=None):
        seen.append(
            (
                self.request.args,
                current_task._get_current_object() is self,
                self.request.called_directly,
                getattr(self.request, "redlock", None),
                fencing_token,
            )
        )
        return x

    assert who(7) == 7
    assert seen == [((7,), True, True, None, None)]
    assert current_task._get_current_object() is None  # popped again


def test_eager_drop(eager_app: Celery):
    ran = []

    @eager_app.task(
        base=LockedTask, bind=True, shared=False, lock_on=("key",), lock_on_duplicate="drop"
    )
    def work(self, key):
        ran.append(key)

    plan = plan_of(work)
    lease = plan.redlock.try_acquire(
        plan.keys.build(("a",), {}), ttl=5, owner=make_owner("outside-holder", 0)
    )
    assert isinstance(lease, Lease)
    try:
        # no message and no stored state in eager mode: the caller gets the error itself
        dropped = work.delay("a")
        assert dropped.state == states.FAILURE
        assert isinstance(dropped.result, TaskRevokedError)
        assert "lock held by task outside-holder" in str(dropped.result)
        with pytest.raises(TaskRevokedError, match="outside-holder"):
            work.apply(("a",), throw=True)
        assert ran == []
        assert work.delay("b").successful()  # another key is free
        assert ran == ["b"]
    finally:
        plan.redlock.release(lease)


@pytest.mark.parametrize(
    "options, conf, match",
    [
        ({"lock_ttl": -1}, {}, "lock_ttl = -1"),
        ({"lock_on_duplicate": "bogus"}, {}, "lock_on_duplicate = 'bogus'"),
        ({"lock_on": ("nope",)}, {}, "'nope' does not start with a parameter"),
        ({}, {"redlock_ttl": 0}, "redlock_ttl = 0"),
    ],
    ids=["lock_ttl", "lock_on_duplicate", "lock_on", "app.conf"],
)
def test_bad_setting_fails_when_the_task_binds(topology: Topology, options, conf, match):
    app = Celery("bad", set_as_current=False)
    app.conf.update(redlock_nodes=topology.quorum.urls, **conf)
    ran = []

    @app.task(base=LockedTask, shared=False, **options)
    def work(key="k"):
        ran.append(key)

    # Defining it is fine (the app is lazy); binding it fails, before anything runs.
    with pytest.raises(ImproperlyConfigured, match=match) as info:
        app.finalize()
    assert isinstance(info.value, ConfigurationError)
    assert ran == []


def test_bad_setting_fails_on_first_access_of_the_task(topology: Topology):
    app = Celery("bad-access", set_as_current=False)
    app.conf.redlock_nodes = topology.quorum.urls

    @app.task(base=LockedTask, shared=False, lock_on_duplicate="bogus")
    def work(key):
        pass

    with pytest.raises(ConfigurationError, match="bogus"):
        work.name  # noqa: B018 - evaluates the lazy task, which binds it


def test_a_task_that_failed_to_bind_refuses_to_publish(topology: Topology):
    """An app that catches the bind error and goes on: the task raises it again on every
    delay(), apply_async() and apply(), and publishes nothing."""
    app = Celery("caught", broker="memory://", set_as_current=False)
    app.conf.redlock_nodes = topology.quorum.urls
    ran = []

    @app.task(base=LockedTask, shared=False, lock_on_duplicat="retry")
    def work(key):
        ran.append(key)

    with pytest.raises(ImproperlyConfigured, match="lock_on_duplicate") as bound:
        app.finalize()  # the application catches this at start-up, and goes on
    published = []
    app.amqp.send_task_message = lambda *a, **kw: published.append(a)  # any publish lands here
    for call in (
        lambda: work.delay("k"),
        lambda: work.apply_async(("k",)),
        lambda: work.apply(("k",)),
        lambda: app.tasks[work.name].delay("k"),
    ):
        with pytest.raises(ImproperlyConfigured, match="lock_on_duplicate") as info:
            call()
        assert info.value is bound.value
    assert published == [] and ran == []
    # A message another producer sent anyway fails on the worker with the same
    # error instead of running without its lock.
    request = {"id": "sent-elsewhere", "args": ("k",), "kwargs": {}, "called_directly": False}
    work.push_request(**request)
    try:
        with pytest.raises(ImproperlyConfigured, match="lock_on_duplicate"):
            app.tasks[work.name]("k")
    finally:
        work.pop_request()
    assert ran == []


def test_token_parameter_without_default_is_a_configuration_error(topology: Topology):
    app = Celery("no-default", set_as_current=False)
    app.conf.redlock_nodes = topology.quorum.urls

    @app.task(base=LockedTask, shared=False)
    def work(key, fencing_token):
        pass

    with pytest.raises(ConfigurationError, match="fencing_token"):
        app.finalize()


def test_django_style_namespace_reaches_the_task_settings(topology: Topology):
    class Settings:
        CELERY_TASK_ALWAYS_EAGER = True
        CELERY_REDLOCK_NODES = ",".join(topology.quorum.urls)
        CELERY_REDLOCK_KEY_PREFIX = topology.prefix
        CELERY_REDLOCK_TTL = 7
        CELERY_REDLOCK_ON_DUPLICATE = "raise"

    app = Celery("django_proj", set_as_current=False)
    app.config_from_object(Settings, namespace="CELERY")

    @app.task(base=LockedTask, bind=True, shared=False, lock_on=())
    def work(self):
        lease = self.request.redlock
        return lease.ttl, lease.redlock.inspect(lease.name)[0]["pttl_ms"]

    settings = plan_of(work).settings
    assert settings.ttl == 7.0
    assert settings.on_duplicate == "raise"
    assert settings.nodes == tuple(topology.quorum.urls)
    ttl, pttl_ms = work.delay().get()
    assert ttl == 7.0
    assert 6000 < pttl_ms <= 7000
