"""A worker on an etcd node, and one on a PostgreSQL node, with no
``redlock_node_timeout`` set: each kind's own default (a raft commit, a commit)
holds under contention on a host with both cores busy. Eight calls of one key
under ``drop``: one runs, seven are dropped naming it, and no round of the
worker counts as an outage (with Redis's 50 ms, some did: their copies were
retried as outages and ran after the holder ended).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import states

from tests.support import harness
from tests.support.harness import Topology, WorkerHandle
from tests.support.postgres import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CALLS = 8


def _missing(kind: str) -> str | None:
    if kind == "etcd":
        from celery_redlock.testing.etcd import etcd_missing

        return etcd_missing()
    from celery_redlock.testing.postgres import postgres_missing

    return postgres_missing()


@pytest.fixture(scope="module", params=["etcd", "postgres"])
def topology(request: pytest.FixtureRequest) -> Iterator[Topology]:
    kind = request.param
    require(_missing(kind))
    with harness.make_topology(f"crl-kt-{kind}", **{kind: True}) as topo:
        topo.node_timeout = None  # unset: the kind brings its own
        yield topo
        topo.assert_nothing_left()


@pytest.fixture(scope="module")
def worker(
    topology: Topology, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[WorkerHandle]:
    harness.WORKER_LOGS.register(pytestconfig)
    env = topology.env(0, 1)
    assert "CRL_NODE_TIMEOUT" not in env
    logdir = str(tmp_path_factory.mktemp("workers"))
    proc = harness.PreforkWorker("kind-timeouts", env, logdir, concurrency=4).start()
    try:
        yield WorkerHandle("prefork", topology.app(0, 1), topology, proc)
    finally:
        proc.stop(now=True)


def _spin(until: Any) -> None:
    while time.monotonic() < until:
        pass


def test_eight_calls_of_one_key_under_drop_one_runs_and_no_outage(worker: WorkerHandle, run: str):
    assert worker.process is not None
    busy = multiprocessing.get_context("fork")
    spinners = [busy.Process(target=_spin, args=(time.monotonic() + 60,)) for _ in range(2)]
    for p in spinners:
        p.start()
    go_key = f"{run}:go"
    try:
        slow = worker.task("slow")
        results = [
            slow.apply_async((run, run), {"duration": 30.0, "go_key": go_key}) for _ in range(CALLS)
        ]
        deadline = time.monotonic() + 60
        while sum(r.state == states.REVOKED for r in results) < CALLS - 1:
            assert time.monotonic() < deadline, [r.state for r in results]
            time.sleep(0.05)
    finally:
        with worker.topology.recorder() as client:
            client.set(go_key, 1, ex=60)
        for p in spinners:
            p.kill()
            p.join()
    for result in results:
        result.get(timeout=30, propagate=False)
    ran = worker.records(run)
    assert len(ran) == 1, f"expected exactly one execution, got {ran}"
    states_ = sorted(r.state for r in results)
    assert states_ == sorted([states.SUCCESS] + [states.REVOKED] * (CALLS - 1)), states_
    with open(worker.process.logfile, encoding="utf-8", errors="replace") as log:
        text = log.read()
    assert "lock nodes unavailable" not in text, worker.process.log_tail()
