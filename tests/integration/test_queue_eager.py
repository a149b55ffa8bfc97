"""``queue`` and ``supersede`` in eager mode (``.apply()``), on three real
redis-server nodes: nothing can be published, so a call of a held key waits
as ``wait`` does, and runs once the holder lets go."""

from __future__ import annotations

import threading
import time

import pytest
from celery import Celery

from celery_redlock import LockedTask, plan_of

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("policy", ["queue", "supersede"])
def test_an_eager_call_of_a_held_key_waits_for_the_holder(redis_nodes3, policy):
    app = Celery("queue-eager", set_as_current=False)
    app.conf.update(redlock_nodes=redis_nodes3.urls, redlock_node_timeout=0.5)

    @app.task(base=LockedTask, shared=False, lock_on=("k",), lock_on_duplicate=policy)
    def work(k):
        return "ran"

    plan = plan_of(work)
    lease = plan.redlock.acquire(plan.keys.build(["x"], {}), ttl=10)
    assert lease is not None
    timer = threading.Timer(0.4, plan.redlock.release, (lease,))
    timer.start()
    started = time.monotonic()
    try:
        assert work.apply(("x",)).get() == "ran"
    finally:
        timer.join()
    assert time.monotonic() - started >= 0.35
