"""What the manual's examples run against when ``sphinx-build -b doctest`` runs them.

Each page's hidden ``testsetup`` calls :func:`start`: three lock nodes and a
broker node, real redis-server processes on loopback, their URLs put where the
examples read them (``$REDLOCK_NODES``, ``$BROKER_URL``, as a deployment would
give them). A page whose example needs a worker starts one, in a thread of the
build process, once its tasks are defined (:func:`worker`). The page's hidden
``testcleanup`` calls :func:`stop`, which stops the worker and the nodes.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from celery_redlock.testing import RedisNodes

_stack: contextlib.ExitStack | None = None


def start() -> RedisNodes:
    """Start the nodes of one page and export their URLs; returns the lock nodes."""
    global _stack
    stop()
    _stack = contextlib.ExitStack()
    nodes = _stack.enter_context(RedisNodes(3))
    broker = _stack.enter_context(RedisNodes(1))[0]
    os.environ["REDLOCK_NODES"] = ",".join(nodes.urls)
    os.environ["BROKER_URL"] = broker.url
    _stack.callback(os.environ.pop, "REDLOCK_NODES", None)
    _stack.callback(os.environ.pop, "BROKER_URL", None)
    return nodes


def worker(app: Any, concurrency: int = 4) -> None:
    """Run a real worker (threads pool) for ``app`` until :func:`stop`."""
    from celery.contrib.testing.worker import start_worker

    assert _stack is not None, "start() first"
    app.conf.worker_hijack_root_logger = False  # leave the logging of the host process alone
    _stack.enter_context(
        start_worker(app, pool="threads", concurrency=concurrency, perform_ping_check=False)
    )


def stop() -> None:
    """Stop the worker and the nodes of the page; idempotent."""
    global _stack
    if _stack is not None:
        stack, _stack = _stack, None
        stack.close()


def django(nodes: RedisNodes) -> None:
    """Set up Django on the tests' project (tests/integration/django_project) for the
    Django page, on a SQLite file, with django-celery-results as the result backend.

    Its examples import ``shop`` (the project's app) under the name a project gives
    it, and write ``proj.settings``: ``DJANGO_SETTINGS_MODULE`` already names the
    tests' settings. :func:`stop` unsets it, and forgets the page's ``@shared_task``
    tasks, so that the apps of later pages are neither Django apps nor get them.
    """
    import importlib
    import sys
    import tempfile

    from celery import _state

    assert _stack is not None, "start() first"
    project = "tests.integration.django_project"
    folder = _stack.enter_context(tempfile.TemporaryDirectory())
    env = {
        "DJANGO_SETTINGS_MODULE": f"{project}.settings",
        "CRL_DJANGO_SQLITE": os.path.join(folder, "db.sqlite3"),
        "CRL_BROKER_URL": os.environ["BROKER_URL"],
        "CRL_NODES": ",".join(nodes.urls),
    }
    for name, value in env.items():
        os.environ[name] = value
        _stack.callback(os.environ.pop, name, None)
    finalizers = set(_state._on_app_finalizers)
    _stack.callback(_state._on_app_finalizers.intersection_update, finalizers)

    import django as django_package
    from django.core.management import call_command

    django_package.setup()
    for name in ("shop", "shop.models"):
        sys.modules[name] = importlib.import_module(f"{project}.{name}")
    call_command("migrate", run_syncdb=True, verbosity=0)
