"""Django: a LockedTask is a ``DjangoTask`` too; the dashboard behind Django's login.

Since Celery 5.4 the Django fixup makes ``celery.contrib.django.task.DjangoTask``
the app's task class (``app.task_cls``), which adds ``delay_on_commit()`` and
``apply_async_on_commit()``. ``base=LockedTask`` would replace it; instead
:class:`LockedTaskType`, LockedTask's metaclass, adds the app's task class to
the bases of every task class made for an app whose task class is a
``DjangoTask`` (Celery's, or a project's subclass of it): ``@app.task`` and
``@shared_task`` alike, as both build the class with its app. With claims, the
on-commit calls of one transaction publish once per key, at commit (see
:mod:`celery_redlock.django.oncommit`).

This module imports no Django: an app whose task class is not a ``DjangoTask``
never loads it. The dashboard's URLs: :func:`celery_redlock.django.dashboard.dashboard_urls`.
"""

from __future__ import annotations

import sys
from typing import Any

from celery.utils.imports import symbol_by_name

__all__ = ["LockedTaskType", "dashboard_urls"]


class LockedTaskType(type):
    """LockedTask's metaclass: a task class made for a Django app is a ``DjangoTask`` too."""

    def __new__(mcls, name: str, bases: tuple, namespace: dict[str, Any], **kwargs: Any) -> Any:
        host = _django_task_class(namespace.get("app"))
        if host is not None and not any(issubclass(base, host) for base in bases):
            from .oncommit import OnCommit

            bases = (*bases, OnCommit, host)
        return super().__new__(mcls, name, bases, namespace, **kwargs)


def _django_task_class(app: Any) -> type | None:
    """``app``'s task class if it is a ``DjangoTask``, else None (Django left unloaded)."""
    task_cls = getattr(app, "task_cls", None)
    if task_cls is None:
        return None
    host = symbol_by_name(task_cls)  # what Celery itself loads for ``app.Task``
    module = sys.modules.get("celery.contrib.django.task")  # loaded only if Django is in use
    if module is None or not (isinstance(host, type) and issubclass(host, module.DjangoTask)):
        return None
    return host


def __getattr__(name: str) -> Any:
    if name == "dashboard_urls":  # imports Django: only on demand
        from .dashboard import dashboard_urls

        return dashboard_urls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
