"""LockedTask under faults: a worker child killed or frozen mid-task, the Redis majority down.

Two prefork worker subprocesses (``a`` consumes queue ``qa``, ``b`` queue
``qb``), so one can be hurt while the other carries on; a private Redis node for
broker, results and recorder, and three others for the quorum, so quorum nodes
can die while the broker lives. The app and the harness are
``tests/integration/lockapp.py``. Timing figures are printed (``-s``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from billiard.exceptions import WorkerLostError
from celery import states

_INTEGRATION = str(Path(__file__).resolve().parent.parent / "integration")
if _INTEGRATION not in sys.path:
    sys.path.insert(0, _INTEGRATION)

import lockapp  # noqa: E402
from lockapp import PreforkWorker, Topology, WorkerHandle, process_state, wait_for  # noqa: E402

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

PREFIX = "crl-faults"


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    with lockapp.make_topology(PREFIX) as topo:
        yield topo


@pytest.fixture(scope="module")
def workers(
    topology: Topology, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[dict[str, WorkerHandle]]:
    """Prefork workers ``a`` (queue qa, 2 children) and ``b`` (queue qb, 4 children)."""
    lockapp.WORKER_LOGS.register(pytestconfig)
    logdir = str(tmp_path_factory.mktemp("fault-workers"))
    env = topology.env(0, 1)
    procs = [
        PreforkWorker("a", env, logdir, queues=["qa"], concurrency=2),
        PreforkWorker("b", env, logdir, queues=["qb"], concurrency=4),
    ]
    try:
        for proc in procs:
            proc.launch()
        for proc in procs:
            proc.await_ready()
        app = topology.app(0, 1)
        yield {proc.name: WorkerHandle("prefork", app, topology, proc) for proc in procs}
    finally:
        errors = []
        for proc in procs:
            try:
                proc.stop()
            except RuntimeError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture(autouse=True)
def _no_lock_left_behind(topology: Topology):
    """After every test, no lock key stays on any (running) quorum node."""
    yield
    topology.assert_no_lock_keys()


@pytest.fixture
def run() -> str:
    return lockapp.new_run()


def _started(handle: WorkerHandle, run: str, task_id: str, timeout: float = 10) -> dict:
    def find():
        return [r for r in handle.records(run, "start") if r["id"] == task_id]

    return wait_for(find, timeout, f"task {task_id} to start")[0]


# -- 3. SIGKILL of the prefork child holding the lock --------------------------------

#: Seconds Celery's prefork pool may take to notice a dead child. It watches each
#: child's sentinel pipe, but the pipe can turn readable a moment before the child
#: is reapable (its threads, e.g. the heartbeat, are still being torn down); the
#: pool then finds nothing to reap, stops watching, and only its periodic
#: maintain_pool (every 5 s, AsynPool.timers) reports the WorkerLostError.
POOL_NOTICES_WITHIN = 5.0 + 1.5


def test_sigkill_of_the_holder_child_frees_the_lock_at_once(
    workers: dict[str, WorkerHandle], run: str
):
    """The parent releases a killed child's lock as soon as Celery reports the WorkerLostError.

    TTL 20 s: a release by TTL expiry could not pass for the parent's release.
    """
    a = workers["a"]
    task = a.task("crash_victim")
    plan = task._lock_plan
    ttl = plan.settings.ttl
    assert ttl == 20.0
    victim = task.apply_async((run, run), {"duration": 60}, queue="qa")
    started = _started(a, run, victim.id)
    pid = started["pid"]
    assert pid in a.process.children(), "the body should run in a pool child of worker a"
    name = plan.keys.build((run, run), {})
    assert plan.redlock.holder(name).task_id == victim.id

    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    follower = task.apply_async((run, run), {"duration": 0.1}, queue="qb")  # on the other worker

    failed_at = freed_at = None
    deadline = time.monotonic() + ttl
    while (failed_at is None or freed_at is None) and time.monotonic() < deadline:
        if failed_at is None and victim.state == states.FAILURE:
            failed_at = time.time()
        if freed_at is None and plan.redlock.holder(name).task_id != victim.id:
            freed_at = time.time()
        time.sleep(0.01)
    assert failed_at is not None, "the pool never reported the dead child"
    assert freed_at is not None, "the dead child's lock was not released before its TTL"
    follower.get(timeout=ttl)
    [after] = [r for r in a.records(run) if r["id"] == follower.id]
    with pytest.raises(WorkerLostError):
        victim.get(timeout=1)

    noticed, freed, next_run = (
        failed_at - killed_at,
        freed_at - killed_at,
        after["start"] - killed_at,
    )
    print(
        f"\nSIGKILL: pool reported WorkerLostError after {noticed:.3f}s, "
        f"lock freed after {freed:.3f}s, "
        f"next run started after {next_run:.3f}s (TTL {ttl}s)"
    )
    # the library's part: release as soon as the parent learns of the death
    assert freed_at - failed_at < 1.0
    # end to end: bounded by the pool noticing, far below the TTL
    assert freed < POOL_NOTICES_WITHIN < ttl
    assert next_run < POOL_NOTICES_WITHIN + 1.0 < ttl
    assert after["token"] > started["token"]


# -- 4. a frozen holder loses its lease, and the fence rejects it ---------------------


def test_frozen_holder_loses_the_lock_and_its_fenced_write_is_rejected(
    workers: dict[str, WorkerHandle], topology: Topology, run: str
):
    a, b = workers["a"], workers["b"]
    task = a.task("fenced_hold")
    ttl = task._lock_plan.settings.ttl
    resource, go_key = f"crl:resource:{run}", f"crl:go:{run}"
    first = task.apply_async((run, run, resource), {"go_key": go_key}, queue="qa")
    held = _started(a, run, first.id)
    pid = held["pid"]
    assert pid in a.process.children()

    # Freeze the child: its heartbeat thread stops with it.
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: process_state(pid) == "T", 5, "the child to stop")
        stopped_at = time.time()
        second = b.task("fenced_hold").apply_async((run, run, resource), queue="qb")
        assert second.get(timeout=ttl + 10) == {"accepted": True, "lost": False}
        [took] = [r for r in b.records(run) if r["id"] == second.id]
        took_after = took["start"] - stopped_at
        assert took_after > ttl / 2, "the frozen holder's lease could not have expired yet"
        assert took["token"] > held["token"]
        assert took["accepted"] is True and took["lost"] is False
    finally:
        os.kill(pid, signal.SIGCONT)
    with topology.recorder() as client:
        client.set(go_key, "1")
        assert first.get(timeout=10) == {"accepted": False, "lost": True}
        [stale] = [r for r in a.records(run) if r["id"] == first.id]
        assert stale["lost"] is True  # self.request.redlock.lost
        assert stale["check_raised"] is True  # check() raised LockLost
        assert stale["accepted"] is False  # the fence refused the stale token
        assert client.get(f"{resource}:value") == second.id
        assert client.get(f"{resource}:fence") == str(took["token"])
    print(
        f"\nSIGSTOP: the other worker took the lock {took_after:.2f}s after the freeze "
        f"(TTL {ttl}s), "
        f"token {held['token']} -> {took['token']}; the stale write was rejected"
    )


# -- 5. the Redis majority down while tasks arrive -----------------------------------


def test_majority_down_tasks_are_kept_and_run_when_the_nodes_return(
    workers: dict[str, WorkerHandle], topology: Topology, run: str
):
    b = workers["b"]
    task = b.task("outage_probe")
    assert task._lock_plan.settings.on_duplicate == "drop"  # an outage must still not drop
    topology.quorum.kill(0)
    topology.quorum.kill(1)
    try:
        results = [task.apply_async((f"{run}-{i}", run), queue="qb") for i in range(5)]
        seen = set()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            for result in results:
                state = result.state
                seen.add(state)
                assert state in (states.PENDING, states.RETRY), (
                    f"{result.id} is {state} during the outage"
                )
            time.sleep(0.05)
        assert states.RETRY in seen
        assert b.records(run) == []
    finally:
        topology.quorum.restart(0)
        topology.quorum.restart(1)
    restarted_at = time.time()
    for result in results:
        result.get(timeout=20)
    ran = b.records(run)
    assert sorted(r["id"] for r in ran) == sorted(r.id for r in results)
    last = max(r["start"] for r in ran) - restarted_at
    print(
        f"\noutage: 5 tasks kept (PENDING/RETRY) for 2s, "
        f"all ran within {last:.2f}s of the nodes' return"
    )


# -- 6. nothing left behind ----------------------------------------------------------


def test_no_lock_key_left_on_any_node(topology: Topology):
    """Last test of the module: every lock was released; fence keys are kept by design."""
    every = topology.quorum.keys(f"{PREFIX}:*")
    assert set(every) == {0, 1, 2}, "a quorum node is down"
    locks = {i: [k for k in keys if k.startswith(f"{PREFIX}:lock:")] for i, keys in every.items()}
    assert locks == {0: [], 1: [], 2: []}
    assert any(k.startswith(f"{PREFIX}:fence:") for keys in every.values() for k in keys)
