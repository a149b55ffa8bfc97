"""The test tasks of ``lock_on_duplicate="queue"`` (added to the app of
:mod:`tests.support.lockapp`): bodies that record their start and end with the
call's sequence number, so a test can tell publish order from run order."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from celery_redlock import LockedTask, LockSuperseded
from celery_redlock.signals import lock_superseded

#: The recorder run the ``lock_superseded`` signal's receiver writes to.
SIGNALS_RUN = "queue-tasks-superseded-signals"


def add_queue_tasks(app: Celery, rec: Any, body: Any, clusters: bool = False) -> None:
    """Give ``app`` the queue tasks; ``body`` is lockapp's recording body. On
    Redis Cluster nodes (``clusters``) the task with ``lock_also`` is left out:
    it is refused at bind there."""

    def task(**options: Any) -> Any:
        options.setdefault("bind", True)
        options.setdefault("lock_on", ("key",))
        options.setdefault("lock_on_duplicate", "queue")
        return app.task(base=LockedTask, shared=False, **options)

    # A 500 ms node timeout: a node stalled on a busy host is no outage here.
    @task(name="lockapp.queued", lock_node_timeout=0.5)
    def queued(self, key, run, duration=0.1, seq=0, fencing_token=None):
        return body(self, key, run, duration, fencing_token, seq=seq)

    @task(name="lockapp.queued_max", lock_queue_max=5, lock_node_timeout=0.5)
    def queued_max(self, key, run, duration=0.1, seq=0, fencing_token=None):
        return body(self, key, run, duration, fencing_token, seq=seq)

    if not clusters:

        @task(name="lockapp.queued_also", lock_also={"qa-shared": 1}, lock_node_timeout=0.5)
        def queued_also(self, key, run, duration=0.1, seq=0, fencing_token=None):
            """Queued per key, and one at a time across keys (a named limit of 1)."""
            return body(self, key, run, duration, fencing_token, seq=seq)

    @task(name="lockapp.queued_rated", lock_rate="5/s", lock_node_timeout=0.5)
    def queued_rated(self, key, run, duration=0.0, seq=0, fencing_token=None):
        return body(self, key, run, duration, fencing_token, seq=seq)

    @task(name="lockapp.queued_retry", lock_node_timeout=0.5, max_retries=1)
    def queued_retry(self, key, run, duration=0.1, seq=0, fencing_token=None):
        """Retries once from its body (``seq`` 0 only): it goes to the back of the queue."""
        body(self, key, run, duration, fencing_token, seq=seq)
        if seq == 0 and not self.request.retries:
            raise self.retry(countdown=0)
        return seq

    @task(name="lockapp.superseded_checking", lock_on_duplicate="supersede", lock_node_timeout=0.5)
    def superseded_checking(self, key, run, duration=0.1, seq=0, fencing_token=None):
        """Checks its lease every 0.1 s; records when a newer call stopped it."""
        lease = self.request.redlock
        start = time.time()
        rec.push(run, phase="start", id=self.request.id, seq=seq, start=start, token=fencing_token)
        while time.time() < start + duration:
            try:
                lease.check()
            except LockSuperseded as exc:
                rec.push(run, phase="stopped", id=self.request.id, seq=seq, start=start,
                         end=time.time(), successor=exc.successor)  # fmt: skip
                raise
            time.sleep(0.1)
        rec.push(run, phase="end", id=self.request.id, seq=seq, start=start, end=time.time(),
                 token=fencing_token)  # fmt: skip
        return seq

    @task(name="lockapp.superseded_plain", lock_on_duplicate="supersede", lock_node_timeout=0.5)
    def superseded_plain(self, key, run, duration=0.1, seq=0, fencing_token=None):
        """Never checks its lease: runs to its end whatever newer calls ask."""
        return body(self, key, run, duration, fencing_token, seq=seq)

    def on_superseded(sender: Any = None, lease: Any = None, successor: Any = None, **_: Any):
        rec.push(SIGNALS_RUN, phase="signal", id=lease.task_id, successor=successor,
                 at=time.time())  # fmt: skip

    lock_superseded.connect(on_superseded, weak=False, dispatch_uid="queue-tasks-superseded")

    @app.task(name="lockapp.plain", bind=True, shared=False)
    def plain(self, run):
        """No lock: when it starts tells how long unlocked work waited."""
        rec.push(run, phase="start", id=self.request.id, pid=os.getpid(), start=time.time())
