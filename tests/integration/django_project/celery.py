"""The project's Celery app, as Celery's Django guide writes it."""

from __future__ import annotations

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.integration.django_project.settings")

app = Celery("django_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_ready.connect
def _write_ready_file(**_: object) -> None:
    """Tell the test harness that the worker consumes (``CRL_READY_FILE``)."""
    path = os.environ.get("CRL_READY_FILE")
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
