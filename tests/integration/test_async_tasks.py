"""``async def`` bodies of a LockedTask on a real prefork worker, and key_of."""

from __future__ import annotations

import uuid

import pytest

from celery_redlock import Redlock, key_of
from tests.support.harness import WorkerHandle, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_eight_calls_of_one_key_with_drop_run_one_async_body_with_its_token(
    prefork_worker: WorkerHandle,
):
    task = prefork_worker.task("async_slow")
    run = f"async-{uuid.uuid4().hex[:8]}"
    results = [task.apply_async(("k1", run), {"duration": 3.5}) for _ in range(8)]
    name = key_of(task, "k1", run)
    assert name == key_of(task, key="k1", run=run, duration=9)  # lock_on=("key",)
    wait_for(lambda: prefork_worker.records(run, "start"), timeout=30)
    sync = Redlock(prefork_worker.topology.quorum.urls, key_prefix=prefork_worker.topology.prefix)
    started = prefork_worker.records(run, "start")[0]
    holder = sync.holder(name)
    assert holder.owner is not None and holder.owner.startswith(started["id"])
    for result in results:
        result.get(timeout=60, propagate=False)
    ended = prefork_worker.records(run, "end")
    assert len(ended) == 1, ended
    (one,) = ended
    assert isinstance(one["token"], int) and one["token"] == started["lease_token"]
    assert len(prefork_worker.records(run, "start")) == 1
    assert one["name"] == name
    assert not one["lost"], "a 3.5 s body under a 1.2 s TTL keeps its lease"
    assert one["end"] - one["start"] >= 3.5
    assert sync.holder(name).owner is None, "released after the body, not before"


def test_key_of_refuses_a_task_that_takes_no_lock(prefork_worker: WorkerHandle):
    @prefork_worker.app.task(name="plain.unlocked", shared=False)
    def unlocked(x):
        return x

    with pytest.raises(TypeError, match="LockedTask"):
        key_of(unlocked, 1)
