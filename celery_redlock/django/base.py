"""LockedTask's metaclass: a task class made for a Django app is a ``DjangoTask`` too.

Imports no Django: an app whose task class is not a ``DjangoTask`` never loads it.
"""

from __future__ import annotations

import sys
from typing import Any

from celery.utils.imports import symbol_by_name

__all__ = ["LockedTaskType"]


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
