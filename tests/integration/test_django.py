"""A Django project's view of the package (tests/integration/django_project): a real
prefork worker runs the project's tasks against its database.

* On-commit publishing (PostgreSQL: skipped with the reason where the server is
  missing, failed under ``CI=true``): nothing is published, and no claim taken,
  before the commit; a rollback publishes nothing; two on-commit calls of one key
  in one transaction publish one message; the fenced ORM update runs on the worker.
* The dashboard under ``/locks/`` with Django's test client: anonymous users go to
  the login page, non-staff users get 403, staff is served, and an action is a POST
  that Django's CSRF protection checks.

Django is configured once per process: on the throwaway PostgreSQL database when the
server answers, else on a SQLite file (the dashboard tests need no more).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import _state, signals

from celery_redlock import result_of
from celery_redlock.plan import plan_of
from tests.support import harness, postgres
from tests.support.harness import Topology
from tests.support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PROJECT = "tests.integration.django_project"


class RolledBack(Exception):
    """Raised in an ``atomic()`` block to roll it back."""


@dataclass
class Project:
    """The project set up in this process: its Celery app, and how a worker runs it."""

    app: Any
    env: dict[str, str]
    pg_missing: str | None  # why the on-commit tests cannot run, if they cannot


@pytest.fixture(scope="module")
def project(topology: Topology, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """Django set up on the project, its tables created."""
    django = pytest.importorskip("django")
    why = postgres.unreachable()
    env = dict(topology.env(0, 1), DJANGO_SETTINGS_MODULE=f"{PROJECT}.settings")
    with _database(why, tmp_path_factory) as db:
        env.update(db)
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        default_app = _state.default_app  # Celery's Django fixup makes the project's the default
        try:
            django.setup()
            from django.core.management import call_command

            from tests.integration.django_project import celery_app
        finally:  # apps made later in this process must not get Celery's Django fixup
            for name, value in saved.items():
                os.environ.pop(name) if value is None else os.environ.update({name: value})
        call_command("migrate", run_syncdb=True, verbosity=0)
        topology.apps.append(celery_app)
        try:
            yield Project(celery_app, env, why)
        finally:
            from django.db import connections

            connections.close_all()
            _state.set_default_app(default_app)


@contextlib.contextmanager
def _database(pg_missing: str | None, tmp: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The settings' database variables: a throwaway PostgreSQL database, else SQLite."""
    if pg_missing is not None:
        yield {"CRL_DJANGO_SQLITE": str(tmp.mktemp("django") / "db.sqlite3")}
        return
    host, port = postgres.address()
    with postgres.throwaway_database() as name:
        yield {"CRL_DJANGO_DB": name, "CRL_DJANGO_DB_HOST": host, "CRL_DJANGO_DB_PORT": str(port)}


@pytest.fixture(scope="module")
def pg_worker(
    project: Project, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[Project]:
    """A prefork worker of the project on its PostgreSQL database."""
    postgres.require(project.pg_missing)
    harness.WORKER_LOGS.register(pytestconfig)
    logdir = str(tmp_path_factory.mktemp("django-worker"))
    proc = harness.PreforkWorker("django", project.env, logdir, app=PROJECT).start()
    try:
        yield project
    finally:
        proc.stop(now=True)


@pytest.fixture
def published() -> Iterator[list[dict]]:
    """The headers of every message this process publishes during the test."""
    sent: list[dict] = []

    def record(sender: Any = None, headers: Any = None, **_: Any) -> None:
        sent.append(dict(headers or {}, task=sender))

    signals.after_task_publish.connect(record, weak=False)
    try:
        yield sent
    finally:
        signals.after_task_publish.disconnect(record)


def claimant(task: Any, *args: Any) -> str | None:
    plan = plan_of(task)
    return plan.redlock.claimant(plan.keys.build(args, {})).claimant


# -- on-commit publishing ---------------------------------------------------------


def test_a_locked_task_of_the_project_is_a_django_task(project):
    from celery.contrib.django.task import DjangoTask

    from tests.integration.django_project.shop import tasks

    for task in (tasks.charge, tasks.rebuild_report, tasks.annotate):
        assert isinstance(task, DjangoTask)


def test_a_rolled_back_transaction_publishes_nothing_and_leaves_no_claim(pg_worker, published):
    from django.db import transaction

    from tests.integration.django_project.shop.models import Report
    from tests.integration.django_project.shop.tasks import rebuild_report

    with pytest.raises(RolledBack), transaction.atomic():
        report = Report.objects.create()
        rebuild_report.delay_on_commit(report.pk)
        assert claimant(rebuild_report, report.pk) is None
        raise RolledBack
    assert published == []
    assert claimant(rebuild_report, report.pk) is None


def test_the_claim_is_taken_at_commit_and_two_calls_publish_one_message(pg_worker, published):
    from django.db import transaction

    from tests.integration.django_project.shop.models import Report
    from tests.integration.django_project.shop.tasks import rebuild_report

    with transaction.atomic():
        report = Report.objects.create()
        rebuild_report.delay_on_commit(report.pk)
        rebuild_report.apply_async_on_commit((report.pk,), task_id=f"left-out-{report.pk}")
        assert claimant(rebuild_report, report.pk) is None
        assert published == []
    assert [message["task"] for message in published] == [rebuild_report.name]
    left_out = rebuild_report.AsyncResult(f"left-out-{report.pk}")
    assert left_out.state == "REVOKED"
    assert result_of(left_out).id == published[0]["id"]
    assert published[0]["redlock_claim"] == plan_of(rebuild_report).keys.build((report.pk,), {})
    # The worker found the row the transaction created, and ran once.
    wait_for(lambda: Report.objects.get(pk=report.pk).builds == 1, 60, "the build")
    wait_for(lambda: claimant(rebuild_report, report.pk) is None, 30, "the claim withdrawn")
    assert Report.objects.get(pk=report.pk).builds == 1


def test_debounced_calls_of_one_transaction_publish_the_newest_once(pg_worker, published):
    from django.db import transaction

    from tests.integration.django_project.shop.models import Order
    from tests.integration.django_project.shop.tasks import annotate

    with transaction.atomic():
        order = Order.objects.create()
        for note in ("first", "second", "third"):
            annotate.delay_on_commit(order.pk, note)
        with pytest.raises(RolledBack), transaction.atomic():  # a savepoint
            annotate.delay_on_commit(order.pk, "rolled back")
            raise RolledBack
    assert len(published) == 1
    wait_for(lambda: Order.objects.get(pk=order.pk).note == "third", 60, "the newest note")


def test_the_fenced_orm_update_runs_on_commit(pg_worker):
    from django.db import transaction

    from tests.integration.django_project.shop.models import Order
    from tests.integration.django_project.shop.tasks import charge

    with transaction.atomic():
        order = Order.objects.create(balance=100)
        for _ in range(5):
            charge.delay_on_commit(order.pk, 7)
    wait_for(lambda: Order.objects.get(pk=order.pk).balance == 65, 60, "five charges")
    assert Order.objects.get(pk=order.pk).fence > 0


# -- the dashboard ----------------------------------------------------------------


@pytest.fixture
def users(project: Project) -> dict[str, Any]:
    from django.contrib.auth.models import User

    User.objects.filter(username__in=["staff", "clerk"]).delete()
    return {
        "staff": User.objects.create_user("staff", password="pw", is_staff=True),
        "clerk": User.objects.create_user("clerk", password="pw"),
    }


def test_the_dashboard_sends_anonymous_users_to_the_login_page(project):
    from django.test import Client

    for path in ("/locks/", "/locks/api/state"):
        response = Client().get(path)
        assert response.status_code == 302
        assert response["Location"] == f"/login/?next={path}"


def test_the_dashboard_refuses_a_user_who_is_not_staff(project, users):
    from django.test import Client

    client = Client()
    client.force_login(users["clerk"])
    assert client.get("/locks/").status_code == 403
    assert client.get("/locks/api/state").status_code == 403


def test_the_dashboard_serves_staff(project, users):
    from django.test import Client

    client = Client()
    client.force_login(users["staff"])
    page = client.get("/locks/")
    assert page.status_code == 200
    assert b"static/dashboard.js" in page.content
    assert client.get("/locks/static/dashboard.js").status_code == 200
    state = client.get("/locks/api/state").json()
    assert state["actions"] is True
    assert state["groups"][0]["answered"] == 3


def test_a_dashboard_action_is_a_post_that_django_checks_for_csrf(project, users, topology):
    from django.test import Client

    from tests.integration.django_project.shop.tasks import rebuild_report

    plan = plan_of(rebuild_report)
    name = plan.keys.build((f"csrf-{os.getpid()}",), {})
    assert plan.redlock.claim_next(name, "queued-task", ttl=60).claimant == "queued-task"
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["staff"])
    session = client.get("/locks/api/session").json()
    assert session["authenticated"] and session["csrf"]
    assert session["csrf_header"].lower() == "x-csrftoken"  # Django's CSRF_HEADER_NAME
    body = {"name": name, "claimant": "queued-task"}
    refused = client.post("/locks/api/withdraw", body, content_type="application/json")
    assert refused.status_code == 403  # no token: Django's CSRF check stops it
    assert plan.redlock.claimant(name).claimant == "queued-task"
    done = client.post(
        "/locks/api/withdraw",
        body,
        content_type="application/json",
        headers={session["csrf_header"]: session["csrf"]},
    )
    assert done.status_code == 200, done.content
    assert done.json()["ok"] is True
    assert plan.redlock.claimant(name).claimant is None
