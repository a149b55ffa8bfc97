"""Fixtures for tests that run real Celery workers against real redis-server nodes.

Topology (module scope, private processes, loopback only; see
:class:`lockapp.Topology`): one Redis node for the broker, the result backends
and the recorder (separate DBs), and three other nodes for the Redlock quorum,
so a test may kill quorum nodes without touching the broker.

Workers (module scope, both built from ``lockapp``):

* ``prefork_worker``: ``celery -A lockapp worker -P prefork -c 4`` in a
  subprocess (broker DB 0, results DB 1). Its output goes to a log file whose
  tail is added to a failed test's report. Teardown stops it by pid, SIGTERM
  then SIGKILL, and fails if any process of its session is left.
* ``threads_worker``: an in-process worker with the threads pool (broker DB 3,
  results DB 4), so the two workers never take each other's messages.
* ``worker``: each of the two in turn.

Each is a :class:`lockapp.WorkerHandle`: the app to send tasks with, and the
runs the task bodies recorded (DB 2).
"""

from __future__ import annotations

from collections.abc import Iterator

import lockapp
import pytest
from lockapp import Topology, WorkerHandle

PREFIX = "crl-it"


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    with lockapp.make_topology(PREFIX) as topo:
        yield topo


@pytest.fixture(scope="module")
def prefork_worker(
    topology: Topology, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[WorkerHandle]:
    lockapp.WORKER_LOGS.register(pytestconfig)
    logdir = str(tmp_path_factory.mktemp("workers"))
    proc = lockapp.PreforkWorker("prefork", topology.env(0, 1), logdir, concurrency=4).start()
    try:
        yield WorkerHandle("prefork", topology.app(0, 1), topology, proc)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def threads_worker(topology: Topology) -> Iterator[WorkerHandle]:
    app = topology.app(3, 4, main="lockapp-threads")
    with lockapp.threads_worker(app, concurrency=4):
        yield WorkerHandle("threads", app, topology)


@pytest.fixture(params=["prefork", "threads"])
def worker(request: pytest.FixtureRequest) -> WorkerHandle:
    """Each kind of worker in turn."""
    return request.getfixturevalue(f"{request.param}_worker")


@pytest.fixture
def run() -> str:
    """A unique id for the test's records and lock keys."""
    return lockapp.new_run()
