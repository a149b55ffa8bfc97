"""Make every Celery app of this interpreter a celery_redlock app (the celery-suite run).

The celery-suite runner puts this folder on ``PYTHONPATH`` and the settings, as
JSON, in ``CELERY_REDLOCK_SUITE_SETTINGS``. Python imports ``sitecustomize`` at
start-up, so Celery's own test process and its prefork children (forked from
it) build every app, with Celery's built-in tasks, on ``LockedTask``. An app
that names a task class of its own (the ``task_cls`` argument, or a subclass
setting the attribute) keeps it; the settings are defaults, below anything the
app configures itself.
"""

from __future__ import annotations

import json
import os

TASK_CLS = "celery_redlock:LockedTask"


def _install(settings: dict) -> None:
    from celery.app import base

    plain_init = base.Celery.__init__
    default_task_cls = base.Celery.task_cls

    def __init__(self, *args, task_cls=None, **kwargs):
        if task_cls is None and type(self).task_cls == default_task_cls:
            task_cls = TASK_CLS
        plain_init(self, *args, task_cls=task_cls, **kwargs)
        self.add_defaults(dict(settings))

    base.Celery.__init__ = __init__


_settings = os.environ.get("CELERY_REDLOCK_SUITE_SETTINGS")
if _settings:
    _install(json.loads(_settings))
