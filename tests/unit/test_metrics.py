"""In-process counts and the Prometheus export (celery_redlock.metrics)."""

from __future__ import annotations

import threading

import prometheus_client as prom
import pytest

from celery_redlock import metrics


@pytest.fixture(autouse=True)
def clean_counts():
    metrics.reset()
    yield
    metrics.reset()


def test_counts_per_event_and_lock():
    metrics.count("acquired", "a")
    metrics.count("acquired", "a")
    metrics.count("acquired", "b")
    metrics.count("lost", "a")
    assert metrics.snapshot() == {"acquired": {"a": 2, "b": 1}, "lost": {"a": 1}}


def test_counts_from_many_threads_add_up():
    def work():
        for _ in range(2000):
            metrics.count("acquired", "threads")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert metrics.snapshot() == {"acquired": {"threads": 8000}}


def test_without_prometheus_only_in_process(monkeypatch):
    monkeypatch.setattr(metrics, "_prom", None)
    metrics.count("acquired", "no-prom")
    metrics.observe(0.001, "no-prom")
    assert metrics.snapshot() == {"acquired": {"no-prom": 1}}


def test_prometheus_export_follows_every_update():
    def events(event, lock):
        value = prom.REGISTRY.get_sample_value(
            "celery_redlock_events_total", {"event": event, "lock": lock}
        )
        return value or 0.0

    def acquisitions(lock):
        value = prom.REGISTRY.get_sample_value(
            "celery_redlock_acquire_seconds_count", {"lock": lock}
        )
        return value or 0.0

    before = events("acquired", "prom-a"), events("acquired", "prom-b"), events("lost", "prom-a")
    timed = acquisitions("prom-a"), acquisitions("prom-b")
    for _ in range(3):  # the first update of a label set and the later ones
        metrics.count("acquired", "prom-a")
        metrics.observe(0.001, "prom-a")
    metrics.count("acquired", "prom-b")
    metrics.count("lost", "prom-a")
    metrics.observe(0.5, "prom-b")
    assert events("acquired", "prom-a") == before[0] + 3
    assert events("acquired", "prom-b") == before[1] + 1
    assert events("lost", "prom-a") == before[2] + 1
    assert acquisitions("prom-a") == timed[0] + 3
    assert acquisitions("prom-b") == timed[1] + 1
    assert metrics.snapshot()["acquired"] == {"prom-a": 3, "prom-b": 1}


EXPORTER_SCRIPT = r"""
import os, sys, urllib.request
import prometheus_client  # imported first, as an app would: per-process values
from prometheus_client import values
from celery_redlock import metrics

assert "celery" not in sys.modules
with metrics.Exporter(0) as exporter:
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == exporter.directory
    pids = []
    for n in range(3):
        pid = os.fork()
        if pid == 0:
            for _ in range(10 + n):
                metrics.count("acquired", "forked")
            metrics.observe(0.001, "forked")
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
        exporter.mark_dead(pid)
    metrics.count("acquired", "forked")  # the parent counts too
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
print(text)
assert not os.path.exists(exporter.directory)
assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
assert values.ValueClass is values.MutexValue  # switched back on close
"""


def test_exporter_adds_up_the_processes_forked_after_it(tmp_path):
    """One scrape sums the parent and three forked children; close cleans up (no Celery)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    out = subprocess.run(
        [sys.executable, "-c", EXPORTER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert 'celery_redlock_events_total{event="acquired",lock="forked"} 34.0' in lines
    assert 'celery_redlock_acquire_seconds_count{lock="forked"} 3.0' in lines


def test_exporter_fails_clearly_without_prometheus(monkeypatch):
    monkeypatch.setattr(metrics, "_prom", None)
    with pytest.raises(RuntimeError, match="prometheus"):
        metrics.Exporter(0)


def test_a_queued_calls_wait_is_exported_per_lock_name():
    def waits(lock, suffix="count"):
        value = prom.REGISTRY.get_sample_value(
            f"celery_redlock_queue_wait_seconds_{suffix}", {"lock": lock}
        )
        return value or 0.0

    before = waits("queue-a"), waits("queue-a", "sum")
    metrics.observe_queue_wait(2.5, "queue-a")
    metrics.observe_queue_wait(0.5, "queue-a")
    assert waits("queue-a") == before[0] + 2
    assert waits("queue-a", "sum") == pytest.approx(before[1] + 3.0)
