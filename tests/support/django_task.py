"""A project's own ``DjangoTask`` subclass, named as an app's ``task_cls`` by the tests."""

from __future__ import annotations

from celery.contrib.django.task import DjangoTask


class ProjectTask(DjangoTask):
    """What a project may make its app's task class, for a common ``on_failure``, say."""
