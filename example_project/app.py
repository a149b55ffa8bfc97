"""The Celery app. Its URLs come from the environment (the runner sets them)."""

import os

from celery import Celery
from celery.schedules import crontab

app = Celery("example_project", include=["example_project.tasks"])
app.conf.update(
    broker_url=os.environ.get("EXAMPLE_BROKER_URL", "redis://127.0.0.1:6379/0"),
    result_backend=os.environ.get("EXAMPLE_RESULT_URL", "redis://127.0.0.1:6379/1"),
    # Three independent Redis masters make the Redlock quorum (two must agree).
    redlock_nodes=os.environ.get("EXAMPLE_REDLOCK_NODES", "redis://127.0.0.1:6379/2"),
    redlock_ttl=3.0,
    redlock_retry_backoff=0.1,
    redlock_retry_backoff_max=1.0,
    worker_prefetch_multiplier=1,
    beat_max_loop_interval=0.5,  # beat wakes often enough for a 1 s entry
    beat_schedule={
        # Every second; two beats run, each slot is sent by one of them.
        "tick": {"task": "example_project.tasks.tick", "schedule": 1.0},
        # Every second, but each run takes 2.5 s: the execution lock drops the slots
        # that arrive while the previous run is still going.
        "sync": {"task": "example_project.tasks.sync", "schedule": 1.0},
        # Every minute.
        "nightly-report": {"task": "example_project.tasks.report", "schedule": crontab()},
    },
)
if os.environ.get("EXAMPLE_NODE_TIMEOUT"):  # one PostgreSQL node: its calls are commits
    app.conf.redlock_node_timeout = float(os.environ["EXAMPLE_NODE_TIMEOUT"])
