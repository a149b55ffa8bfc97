"""A redelivered message: dropped while its first delivery runs, run once that one died."""

import time

import pytest
from celery import Celery
from celery.exceptions import TaskRevokedError

from celery_redlock import LockedTask, heartbeat
from celery_redlock.redlock import make_owner

pytestmark = pytest.mark.integration

TTL = 1.0


@pytest.fixture
def app(redis_nodes3):
    app = Celery("redelivery", set_as_current=False)
    app.conf.update(redlock_nodes=redis_nodes3.urls, redlock_ttl=TTL, redlock_node_timeout=0.5)
    ran = []

    @app.task(base=LockedTask, bind=True, lock_on=("k",), name="redelivery.work", shared=False)
    def work(self, k):
        ran.append(self.request.id)
        return self.request.redlock.fencing_token

    app.finalize()
    app.ran = ran
    yield app
    app.close()


def first_delivery(app, task_id, renewed):
    """The lock as the first delivery of ``task_id`` took it (retries 0)."""
    task = app.tasks["redelivery.work"]
    plan = task._lock_plan
    lease = plan.redlock.acquire(plan.keys.build(("x",), {}), ttl=TTL, owner=make_owner(task_id, 0))
    if renewed:
        heartbeat.hold(lease, TTL / 3)
    return plan.redlock, lease


def test_a_redelivery_runs_once_the_first_delivery_died(app):
    redlock, lease = first_delivery(app, "task-1", renewed=False)  # nobody renews: it died
    started = time.monotonic()
    result = app.tasks["redelivery.work"].apply(("x",), task_id="task-1")
    waited = time.monotonic() - started
    assert result.successful(), result.traceback
    assert app.ran == ["task-1"]
    assert result.result > lease.fencing_token
    assert TTL * 0.5 < waited < TTL * 1.5 + 0.5, waited


def test_a_redelivery_is_dropped_while_the_first_delivery_runs(app):
    redlock, lease = first_delivery(app, "task-2", renewed=True)
    try:
        started = time.monotonic()
        result = app.tasks["redelivery.work"].apply(("x",), task_id="task-2")
        waited = time.monotonic() - started
        assert isinstance(result.result, TaskRevokedError), result.result
        assert "redelivery" in str(result.result)
        assert app.ran == []
        assert waited >= TTL * 1.5 - 0.1, waited
        assert not lease.lost
    finally:
        heartbeat.drop(lease)
        redlock.release(lease)


def test_a_duplicate_with_another_task_id_is_dropped_at_once(app):
    redlock, lease = first_delivery(app, "task-3", renewed=True)
    try:
        started = time.monotonic()
        result = app.tasks["redelivery.work"].apply(("x",), task_id="task-4")
        assert isinstance(result.result, TaskRevokedError)
        assert time.monotonic() - started < 0.5
    finally:
        heartbeat.drop(lease)
        redlock.release(lease)
