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
