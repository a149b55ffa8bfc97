"""One scrape of a prefork worker's ``/metrics`` counts what every pool child did.

A real ``celery worker -P prefork -c 4`` (subprocess) with ``redlock_metrics_port``
set runs 100 locked tasks spread over its children; the endpoint its main
process serves adds their counts up. Stopping the worker stops the endpoint
and removes the multiprocess directory it made.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import harness, lockapp
from tests.support.harness import Topology, WorkerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

QUEUE = "metrics"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of one GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def multiproc_dirs() -> set[str]:
    import tempfile

    tmp = tempfile.gettempdir()
    return {n for n in os.listdir(tmp) if n.startswith("celery_redlock-metrics-")}


@pytest.fixture
def metrics_worker(topology: Topology, tmp_path_factory, pytestconfig):
    harness.WORKER_LOGS.register(pytestconfig)
    port = free_port()
    conf = {"redlock_metrics_port": port, "task_default_queue": QUEUE}
    env = dict(topology.env(12, 13), CRL_CONF=json.dumps(conf))
    logdir = str(tmp_path_factory.mktemp("metrics"))
    before = multiproc_dirs()
    proc = harness.PreforkWorker("metrics", env, logdir, queues=[QUEUE], concurrency=4).start()
    try:
        app = lockapp.app_from_env(env, main="metrics-client")
        topology.apps.append(app)
        yield WorkerHandle("prefork", app, topology, proc), port, before
    finally:
        proc.stop(now=True)


def test_one_scrape_adds_up_every_pool_child(metrics_worker, run):
    handle, port, dirs_before = metrics_worker
    made = multiproc_dirs() - dirs_before
    assert len(made) == 1, made  # the worker's own multiprocess directory
    task = handle.task("slow")
    results = [task.apply_async((f"{run}-{i}", run), {"duration": 0.0}) for i in range(100)]
    for result in results:
        result.get(timeout=60)
    ran = handle.records(run)
    assert len(ran) == 100
    pids = {r["pid"] for r in ran}
    assert len(pids) > 1, f"one child ran everything: {pids}"  # else nothing to add up
    assert handle.process.pid not in pids

    samples = scrape(port)
    acquired = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "celery_redlock_events_total" and ("event", "acquired") in labels
    }
    assert sum(acquired.values()) == 100, acquired
    assert acquired == {(("event", "acquired"), ("lock", "lockapp.slow")): 100.0}
    timed = samples[("celery_redlock_acquire_seconds_count", (("lock", "lockapp.slow"),))]
    assert timed == 100.0
    assert f"lock metrics of every worker process: http://127.0.0.1:{port}/metrics" in (
        handle.process.log_tail(400)
    )
    print(f"\nprefork metrics: 100 acquisitions over children {sorted(pids)}, one scrape")

    handle.process.stop()
    with pytest.raises(OSError):  # the endpoint went with the worker
        scrape(port)
    assert multiproc_dirs() - dirs_before == set(), "the multiprocess directory was left behind"
