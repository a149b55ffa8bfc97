"""A LockedTask is a ``DjangoTask`` exactly when the app's task class is one; outside
Django nothing changes and Django's database layer is never imported. Each case runs
in a fresh interpreter: Celery's Django fixup reads ``DJANGO_SETTINGS_MODULE`` when
an app is made, and ``@shared_task`` tasks go to every app of the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("django")

ROOT = Path(__file__).resolve().parents[2]

MAKE_TASKS = """
import sys
from celery import Celery, shared_task
from celery_redlock import LockedTask

app = Celery("proj", broker="memory://", task_cls=TASK_CLS)

@app.task(base=LockedTask)
def by_app(key): ...

@shared_task(base=LockedTask)
def shared(key): ...

tasks = [by_app._get_current_object(), shared._get_current_object()]
django_task = sys.modules.get("celery.contrib.django.task")
is_django = [django_task is not None and isinstance(t, django_task.DjangoTask) for t in tasks]
"""


def run(code: str, settings: str | None, task_cls: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    if settings:
        env["DJANGO_SETTINGS_MODULE"] = settings
    source = MAKE_TASKS.replace("TASK_CLS", repr(task_cls)) + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_outside_django_a_locked_task_stays_a_plain_task_and_django_is_not_loaded():
    out = run(
        """
        print(is_django, [hasattr(t, "delay_on_commit") for t in tasks],
              "django.db" in sys.modules, "celery.contrib.django.task" in sys.modules)
        """,
        settings=None,
    )
    assert out == "[False, False] [False, False] False False"


def test_in_a_django_project_shared_task_and_app_task_are_django_tasks():
    out = run(
        """
        from celery_redlock.django.oncommit import OnCommit
        print(is_django, [type(t).delay_on_commit is OnCommit.delay_on_commit for t in tasks])
        """,
        settings="tests.integration.django_project.settings",
    )
    assert out == "[True, True] [True, True]"


def test_a_projects_own_django_task_class_is_kept():
    out = run(
        """
        print([type(t).__mro__.index(MyTask) > type(t).__mro__.index(LockedTask) for t in tasks])
        """.replace("MyTask", "sys.modules['tests.support.django_task'].ProjectTask"),
        settings="tests.integration.django_project.settings",
        task_cls="tests.support.django_task:ProjectTask",
    )
    assert out == "[True, True]"


def test_a_custom_task_class_that_is_not_a_django_task_is_left_alone():
    out = run(
        "print(is_django)",
        settings="tests.integration.django_project.settings",
        task_cls="celery.app.task:Task",
    )
    assert out == "[False, False]"
