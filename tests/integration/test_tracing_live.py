"""The lock's events on the task spans of opentelemetry-instrumentation-celery.

A real worker (in-process, threads pool) runs instrumented by
``CeleryInstrumentor``; spans go to the SDK's in-memory exporter, and each
test reads the ``run/<task>`` span of every execution: acquired and released
with the fencing token the body got, or the contention outcome naming the
holder.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel test needs opentelemetry-sdk")
pytest.importorskip(
    "opentelemetry.instrumentation.celery",
    reason="the otel test needs opentelemetry-instrumentation-celery",
)

from opentelemetry.instrumentation.celery import CeleryInstrumentor  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from celery_redlock import tracing  # noqa: E402
from celery_redlock.plan import plan_of  # noqa: E402
from tests.support.harness import WorkerHandle, wait_for  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def spans():
    """Celery instrumented for the test, its spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


@pytest.fixture
def traced_worker(spans, threads_worker: WorkerHandle) -> Iterator[WorkerHandle]:
    """The in-process worker, started after the instrumentation.

    The instrumentation keeps a running task's span under its task id, so a
    retry of that id that starts in another thread before the first attempt's
    ``task_postrun`` takes the first attempt's place (its span is never ended,
    the retry's is ended early and empty). Full jitter can draw a countdown of
    nearly 0; the retry backoff's jitter is pinned at its top here so the
    retried copy comes a whole backoff (1 s) later.
    """
    redlock = plan_of(threads_worker.task("slow_retry")).redlock
    drawn = redlock.rng
    redlock.rng = lambda: 1.0
    try:
        yield threads_worker
    finally:
        redlock.rng = drawn


def run_span(exporter: InMemorySpanExporter, task_id: str):
    """The finished ``run/<task>`` span of execution ``task_id`` (waits briefly for it)."""

    def find():
        return [
            s
            for s in exporter.get_finished_spans()
            if s.name.startswith("run/") and s.attributes.get("messaging.message.id") == task_id
        ]

    return wait_for(find, 10, f"the run span of {task_id}")[0]


def events(span) -> dict[str, dict]:
    return {e.name: dict(e.attributes) for e in span.events if e.name.startswith("redlock.")}


def test_the_api_is_there():
    assert tracing.ENABLED


def test_acquire_token_and_release_on_the_task_span(traced_worker, spans, run):
    task = traced_worker.task("slow")
    result = task.apply_async((run, run), {"duration": 0.2})
    token = result.get(timeout=20)["token"]
    span = run_span(spans, result.id)
    assert span.name == "run/lockapp.slow"
    seen = events(span)
    assert list(seen) == ["redlock.acquired", "redlock.released"]
    acquired, released = seen["redlock.acquired"], seen["redlock.released"]
    assert acquired["redlock.lock"] == "lockapp.slow"
    assert acquired["redlock.fencing_token"] == token
    assert acquired["redlock.key"].startswith(f"{traced_worker.topology.prefix}:lock:lockapp.slow:")
    assert 0 <= acquired["redlock.wait_seconds"] < 5
    assert released == {"redlock.lock": "lockapp.slow", "redlock.lost": False,
                        "redlock.fencing_token": token}  # fmt: skip
    assert span.attributes["redlock.outcome"] == "acquired"
    assert span.attributes["redlock.fencing_token"] == token
    assert span.attributes["redlock.key"] == acquired["redlock.key"]
    # the lock's events happen inside the task span, in order
    acquired_at, released_at = (e.timestamp for e in span.events if e.name.startswith("redlock."))
    assert span.start_time <= acquired_at <= released_at <= span.end_time


@pytest.mark.parametrize(
    ("name", "outcome"), [("slow", "dropped"), ("slow_raise", "raised"), ("slow_retry", "retried")]
)
def test_the_contention_outcome_names_the_holder(traced_worker, spans, run, name, outcome):
    task = traced_worker.task(name)
    holder = task.apply_async((run, run), {"duration": 1.5})
    wait_for(lambda: traced_worker.records(run, "start"), 10, "the holder to start")
    duplicate = task.apply_async((run, run), {"duration": 0.1})
    # the first run span of the duplicate (a retried one runs again later)
    span = run_span(spans, duplicate.id)
    seen = events(span)
    assert f"redlock.{outcome}" in seen, seen
    assert "redlock.acquired" not in seen
    assert seen[f"redlock.{outcome}"]["redlock.holder"] == holder.id
    assert span.attributes["redlock.outcome"] == outcome
    holder.get(timeout=20)
    if outcome == "retried":
        duplicate.get(timeout=30)


def test_a_wait_then_acquire(traced_worker, spans, run):
    task = traced_worker.task("slow_wait")
    first = task.apply_async((run, run), {"duration": 1.0})
    wait_for(lambda: traced_worker.records(run, "start"), 10, "the first to start")
    started = time.monotonic()
    second = task.apply_async((run, run), {"duration": 0.1})
    first.get(timeout=20)
    token = second.get(timeout=20)["token"]
    span = run_span(spans, second.id)
    seen = events(span)
    assert list(seen) == ["redlock.waiting", "redlock.acquired", "redlock.released"]
    assert seen["redlock.waiting"]["redlock.holder"] == first.id
    assert seen["redlock.waiting"]["redlock.timeout"] == 30.0
    waited = seen["redlock.acquired"]["redlock.wait_seconds"]
    assert 0.1 < waited <= time.monotonic() - started
    assert seen["redlock.acquired"]["redlock.fencing_token"] == token
