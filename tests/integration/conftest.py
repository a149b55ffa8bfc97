"""Fixtures for tests that run real Celery workers against real redis-server nodes.

Topology (module scope, private processes, loopback only; see
:class:`tests.support.harness.Topology`): one Redis node for the broker, the
result backends and the recorder (separate DBs), and three other nodes for the
Redlock quorum, so a test may kill quorum nodes without touching the broker.
When the module ends, its teardown checks that no quorum node holds a lock key.

Workers, both running the app of :mod:`tests.support.lockapp`:

* ``prefork_worker`` (module scope): ``celery -A tests.support.lockapp worker
  -P prefork -c 4`` in a subprocess (broker DB 0, results DB 1). Its output
  goes to a log file whose tail is added to a failed test's report. Teardown
  stops it by pid, SIGTERM then SIGKILL, and fails if any process of its
  session is left.
* ``threads_worker`` (function scope): Celery's own pytest fixtures:
  ``celery_app`` configured by ``celery_config`` below (broker DB 3, results
  DB 4, so the two workers never take each other's messages; ``redlock_nodes``
  = the quorum), and the in-thread ``celery_worker`` with the threads pool
  (``celery_worker_pool``, ``celery_worker_parameters``).
* ``worker``: each of the two in turn.
* ``amqp_worker`` (module scope): the prefork worker on RabbitMQ
  (:data:`brokers.AMQP_URL`, results still in Redis), consuming a queue of its own
  (``crl-it-<random>``, deleted with its exchange at teardown), so runs never
  meet each other's leftovers. Without a reachable broker it skips, or fails
  under ``CI=true`` (see :func:`amqp_url`).
* ``policy_worker``: the policy tests' workers: prefork and threads on the
  Redis broker, and prefork on the AMQP broker.

Each is a :class:`tests.support.harness.WorkerHandle`: the app to send tasks
with, and the runs the task bodies recorded (DB 2).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from tests.support import brokers, harness, lockapp
from tests.support.harness import Topology, WorkerHandle

PREFIX = "crl-it"


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    with harness.make_topology(PREFIX) as topo:
        yield topo
        topo.assert_nothing_left()


@pytest.fixture(scope="module")
def prefork_worker(
    topology: Topology, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[WorkerHandle]:
    harness.WORKER_LOGS.register(pytestconfig)
    logdir = str(tmp_path_factory.mktemp("workers"))
    proc = harness.PreforkWorker("prefork", topology.env(0, 1), logdir, concurrency=4).start()
    try:
        yield WorkerHandle("prefork", topology.app(0, 1), topology, proc)
    finally:
        proc.stop(now=True)


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The RabbitMQ URL once a broker answers there (see :func:`brokers.require_amqp`)."""
    return brokers.require_amqp()


@pytest.fixture(scope="module")
def amqp_worker(
    amqp_url: str,
    topology: Topology,
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Iterator[WorkerHandle]:
    """A prefork worker (-c 4) on RabbitMQ, results in Redis DB 9, on a queue of its own."""
    harness.WORKER_LOGS.register(pytestconfig)
    queue = f"crl-it-{uuid.uuid4().hex[:12]}"
    env = dict(
        topology.env(0, 9),
        CRL_BROKER_URL=amqp_url,
        CRL_CONF=json.dumps({"task_default_queue": queue}),
    )
    logdir = str(tmp_path_factory.mktemp("amqp"))
    try:
        proc = harness.PreforkWorker("amqp", env, logdir, queues=[queue], concurrency=4).start()
        try:
            app = lockapp.app_from_env(env, main="amqp-client")
            topology.apps.append(app)
            yield WorkerHandle("prefork-amqp", app, topology, proc)
        finally:
            proc.stop(now=True)
    finally:
        harness.delete_amqp_queue(amqp_url, queue)


@pytest.fixture
def celery_config(topology: Topology) -> dict[str, Any]:
    """The in-process app: broker DB 3, results DB 4, locks on the quorum nodes."""
    return dict(
        lockapp.app_conf(topology.quorum.urls, topology.prefix),
        broker_url=topology.url(3),
        result_backend=topology.url(4),
        **({"redlock_node_timeout": topology.node_timeout} if topology.node_timeout else {}),
    )


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    return "threads"


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    return {
        "concurrency": 4,
        "perform_ping_check": False,
        "shutdown_timeout": 30.0,
        "loglevel": "WARNING",
    }


@pytest.fixture
def lock_tasks(celery_app: Celery, topology: Topology) -> Celery:
    """``celery_app`` with the test tasks, registered before ``celery_worker`` starts."""
    return lockapp.add_tasks(celery_app, topology.url(harness.RECORDER_DB), topology.min_ttl or 0.0)


@pytest.fixture
def threads_worker(lock_tasks: Celery, celery_worker: Any, topology: Topology) -> WorkerHandle:
    return WorkerHandle("threads", lock_tasks, topology)


@pytest.fixture(params=["prefork", "threads"])
def worker(request: pytest.FixtureRequest) -> WorkerHandle:
    """Each kind of worker in turn."""
    return request.getfixturevalue(f"{request.param}_worker")


@pytest.fixture(params=["prefork", "threads", "amqp"])
def policy_worker(request: pytest.FixtureRequest) -> WorkerHandle:
    """The contention policy tests' workers: prefork and threads on the Redis broker,
    prefork on RabbitMQ."""
    return request.getfixturevalue(f"{request.param}_worker")


@pytest.fixture
def run() -> str:
    """A unique id for the test's records and lock keys."""
    return harness.new_run()
