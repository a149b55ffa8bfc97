"""Fixtures shared by the unit and the integration tests.

pytest-celery's plugin is loaded (its fixtures: ``celery_config``,
``celery_app``, ``celery_worker_pool``, ...). Its ``celery_worker`` is the one
of its Docker-backed setups, which shadows the in-thread ``celery_worker`` of
``celery.contrib.pytest`` it re-exports; this conftest brings that in-thread
worker back, so a test asking for ``celery_worker`` gets a real worker running
in a thread of the test process, without Docker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import celery
import kombu
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from kombu.asynchronous import set_event_loop

from celery_redlock import testing
from tests.support import kinds

if celery.VERSION < (5, 7):
    # Celery 5.5's Redis result backend: an AsyncResult collected by the garbage
    # collector in the middle of that backend's own pub/sub command unsubscribes
    # on the same connection from __del__ and hangs the test process. The
    # tests drop thousands of results; 5.7's consumer is re-entrant.
    AsyncResult.__del__ = lambda self: None  # type: ignore[method-assign]

# Celery's own integration suite with the plugin: a tool of its own (tox -e celery-suite).
collect_ignore = ["celery_suite"]


@pytest.fixture
def celery_worker(
    celery_app: Celery,
    celery_includes: Sequence[str],
    celery_worker_pool: str,
    celery_worker_parameters: dict[str, Any],
) -> Iterator[Any]:
    """``celery.contrib.pytest``'s in-thread worker, with an event loop of its own.

    kombu keeps one event loop per process, and a worker started after another
    in the same process takes over the first one's loop, whose timer is not the
    new worker's: on Celery 5.5 its countdown and ETA messages never run. A
    worker process has a loop of its own; so does each worker here.
    """
    for module in celery_includes:
        celery_app.loader.import_task_module(module)
    set_event_loop(None)
    with start_worker(celery_app, pool=celery_worker_pool, **celery_worker_parameters) as worker:
        if kombu.VERSION < (5, 7) and worker.hub is not None:
            # kombu 5.5: an ack made in a pool thread does not wake the loop, so
            # prefetch credit returns only at its next wake-up, up to 10 s later
            # (celery#6941); kombu 5.7 keeps polling.
            worker.hub.timer.call_repeatedly(0.1, lambda: None)
        yield worker
    set_event_loop(None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Keep each phase's report on the item: a fixture can tell, at teardown,
    that its test failed and print what explains it (``item.failed``)."""
    report = yield
    if report.failed:
        item.failed = True  # type: ignore[attr-defined]
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After each test's teardown, resume any node it left paused (module-scoped nodes too)."""
    try:
        return (yield)
    finally:
        testing.resume_paused()


@pytest.fixture(**kinds.params(lambda s: s.core))
def nodes3(request: pytest.FixtureRequest) -> Any:
    """The lock nodes of the core suites, empty, one kind after another
    (:data:`tests.support.kinds.NODE_SETS`): three plain Redis masters, three
    Redis Clusters of three masters each (each cluster one lock node), three
    PostgreSQL servers, one PostgreSQL server alone, one etcd cluster (of one
    member) alone, and three memory nodes. ``.urls`` and
    ``.keys()`` work alike; ``[i].client()`` (a Redis client) only on Redis
    nodes: a test of Redis internals takes
    ``redis_nodes3``. A test that needs a minority to fail skips where there is
    one node (:func:`tests.support.kinds.needs_three`)."""
    return request.getfixturevalue(request.param)


@pytest.fixture(**kinds.params(lambda s: s.quick))
def quick3(request: pytest.FixtureRequest) -> Any:
    """Three lock nodes that start and restart (empty) at once, one kind after
    another: three Redis masters, three memory nodes."""
    return request.getfixturevalue(request.param)
