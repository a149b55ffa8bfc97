"""States never go backwards: a retried task id ends in its last execution's state.

A real worker (threads pool, two threads, in this process) on a Redis broker,
with Celery's Redis result backend and its SQLAlchemy one (SQLite), each made
to store RETRY as late as the worker lets it (:mod:`tests.support.late_retry`):
if the retried message were published before the RETRY store, the new
execution would end first and the RETRY would land over its state, every time.
Three ways a locked task id is retried: the lock's own re-publish on
contention, its re-publish during an outage, and the body's ``self.retry()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, signals, states
from celery.contrib.testing.worker import start_worker

from celery_redlock import LockedTask, plan_of
from celery_redlock.headers import attempt_of
from tests.support import late_retry
from tests.support.harness import Topology, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FAST = {"lock_retry_backoff": 0.01, "lock_retry_backoff_max": 0.01}

#: (task id, retries) of each execution of ``late.own_retry``, in this process.
RAN: list[tuple[str, int]] = []


@pytest.fixture(params=["redis", "database"])
def app(request, topology: Topology, tmp_path, run: str) -> Iterator[Celery]:
    """An app whose result backend stores RETRY late, with its worker running."""
    if request.param == "redis":
        backend = f"tests.support.late_retry:LateRedisBackend+{topology.url(7)}"
    else:
        backend = f"tests.support.late_retry:LateDatabaseBackend+sqlite:///{tmp_path}/results.db"
    app = Celery("late-retry", broker=topology.url(8), backend=backend, set_as_current=False)
    app.conf.update(
        redlock_nodes=topology.quorum.urls,
        redlock_key_prefix=topology.prefix,
        task_default_queue=f"late-{run}",
        broker_connection_retry_on_startup=False,
    )

    def task(name: str, **options: Any) -> Any:
        return app.task(
            base=LockedTask, bind=True, shared=False, name=name, lock_on=("key",), **options
        )

    @task("late.contended", lock_on_duplicate="retry", **FAST)
    def contended(self, key):
        raise RuntimeError(f"ran at lock attempt {attempt_of(self.request)}")

    @task("late.outage", **FAST)
    def outage(self, key):
        raise RuntimeError(f"ran at lock attempt {attempt_of(self.request)}")

    @task("late.own_retry", max_retries=1)
    def own_retry(self, key):
        RAN.append((self.request.id, self.request.retries))
        if not self.request.retries:
            raise self.retry(countdown=0)
        raise RuntimeError("ran after its own retry")

    topology.apps.append(app)
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield app


@pytest.fixture
def retried() -> Iterator[list[str]]:
    """Task ids Celery's ``task_retry`` signal was sent for."""
    seen: list[str] = []

    def note(request: Any = None, **_: Any) -> None:
        seen.append(request.id)

    signals.task_retry.connect(note, weak=False, dispatch_uid="test_retry_states")
    yield seen
    signals.task_retry.disconnect(dispatch_uid="test_retry_states")


def final_state(app: Celery, task_id: str, gate: late_retry.Gate) -> Any:
    """The stored result once the first RETRY and a terminal state are both stored."""
    assert gate.retry_stored.wait(60), "no RETRY was stored"
    assert gate.terminal.wait(60), "no execution ended"
    return app.AsyncResult(task_id)


def check(app: Celery, task_id: str, gate: late_retry.Gate, said: str, retried: list) -> None:
    result = final_state(app, task_id, gate)
    assert result.state == states.FAILURE, gate.states  # not RETRY: the last word stands
    assert said in str(result.result)
    assert not gate.held, "the retried message went out before its RETRY was stored"
    assert gate.states[0] == states.RETRY and gate.states[-1] == states.FAILURE
    assert task_id in retried  # Celery's own retry signal, as ever


def test_the_locks_retry_on_contention(app, run, retried):
    task = app.tasks["late.contended"]
    plan = plan_of(task)
    holder = plan.redlock.acquire(plan.keys.build((run,), {}), ttl=30)
    assert holder is not None
    task_id = f"contended-{run}"
    gate = late_retry.watch(task_id, on_republish=lambda: plan.redlock.release(holder))
    task.apply_async((run,), task_id=task_id)
    check(app, task_id, gate, "ran at lock attempt 1", retried)


def test_the_locks_retry_in_an_outage(app, run, retried, topology):
    task = app.tasks["late.outage"]
    task_id = f"outage-{run}"

    def heal() -> None:
        topology.quorum.restart(0)
        topology.quorum.restart(1)

    gate = late_retry.watch(task_id, on_republish=heal)
    topology.quorum.kill(0)
    topology.quorum.kill(1)
    try:
        task.apply_async((run,), task_id=task_id)
        check(app, task_id, gate, "ran at lock attempt", retried)
    finally:
        topology.quorum.heal()


def test_the_bodys_own_retry(app, run, retried):
    task = app.tasks["late.own_retry"]
    task_id = f"own-{run}"
    gate = late_retry.watch(task_id)
    task.apply_async((run,), task_id=task_id)
    check(app, task_id, gate, "ran after its own retry", retried)


class _Kept(logging.Handler):
    """Keeps the records of one logger (the worker's logging setup owns the root's)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


def test_a_retry_whose_retry_store_fails_still_runs(app, run):
    kept, logger = _Kept(), logging.getLogger("celery_redlock.republish")
    level = logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.WARNING)  # the test worker logs errors only
    try:
        _retry_store_fails(app, run, kept)
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)


def _retry_store_fails(app: Celery, run: str, kept: _Kept) -> None:
    task = app.tasks["late.own_retry"]
    task_id = f"unstored-{run}"
    gate = late_retry.watch(task_id, fail_retry=True)
    task.apply_async((run,), task_id=task_id)
    assert gate.terminal.wait(60)
    wait_for(lambda: (task_id, 1) in RAN, 30, "the retried execution to run")
    assert [r for r in RAN if r[0] == task_id] == [(task_id, 0), (task_id, 1)]
    assert states.RETRY not in gate.states
    assert any("RETRY was not stored" in said for said in kept.said), kept.said
