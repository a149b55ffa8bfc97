"""A small app for the tests of a worker whose locks cannot work: one LockedTask.

Configured from environment variables: ``CRL_BROKER_URL``, ``CRL_BACKEND_URL``,
``CRL_QUEUE``, ``CRL_NODES`` (comma-separated; unset: no ``redlock_nodes``),
``CRL_CONF`` (JSON, more settings); ``CRL_READY_FILE`` names a file written
when the worker is ready to consume.
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery
from celery import signals as celery_signals

from celery_redlock import LockedTask


def make_app(env: Any = os.environ, main: str = "refuseapp") -> Celery:
    app = Celery(main, broker=env["CRL_BROKER_URL"], backend=env["CRL_BACKEND_URL"])
    app.conf.update(
        task_default_queue=env["CRL_QUEUE"],
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=False,
        **json.loads(env.get("CRL_CONF") or "{}"),
    )
    if env.get("CRL_NODES"):
        app.conf.redlock_nodes = env["CRL_NODES"].split(",")

    @app.task(base=LockedTask, bind=True, name="refuseapp.locked", lock_on=("key",), shared=False)
    def locked(self, key):
        return {"key": key, "pid": os.getpid(), "attempt": self.request.headers}

    return app


def _write_ready_file(**_: Any) -> None:
    path = os.environ["CRL_READY_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


#: What ``celery -A tests.support.refuseapp`` finds; None outside a worker subprocess.
app: Celery | None = make_app() if os.environ.get("CRL_BROKER_URL") else None
if app is not None and os.environ.get("CRL_READY_FILE"):
    celery_signals.worker_ready.connect(_write_ready_file, weak=False)
