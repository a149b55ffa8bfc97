"""Django: a LockedTask is a ``DjangoTask`` too; the dashboard behind Django's login.

Since Celery 5.4 the Django fixup makes ``celery.contrib.django.task.DjangoTask``
the app's task class (``app.task_cls``), which adds ``delay_on_commit()`` and
``apply_async_on_commit()``. ``base=LockedTask`` would replace it; instead
LockedTask's metaclass (:class:`~celery_redlock.django.base.LockedTaskType`)
adds the app's task class to the bases of every task class made for an app
whose task class is a ``DjangoTask`` (Celery's, or a project's subclass of it):
``@app.task`` and ``@shared_task`` alike, as both build the class with its app.
With claims, the on-commit calls of one transaction publish once per key, at
commit (see :mod:`celery_redlock.django.oncommit`).

Importing this package imports no Django. The dashboard's URLs:
:func:`~celery_redlock.django.dashboard.dashboard_urls`, also importable from here.
"""

from __future__ import annotations

from typing import Any

from .base import LockedTaskType

__all__ = ["LockedTaskType", "dashboard_urls"]


def __getattr__(name: str) -> Any:
    if name == "dashboard_urls":  # imports Django: only on demand
        from .dashboard import dashboard_urls

        return dashboard_urls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
