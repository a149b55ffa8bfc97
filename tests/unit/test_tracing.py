"""celery_redlock.tracing: events on the current span, and nothing without one."""

from __future__ import annotations

import pytest

from celery_redlock import tracing
from celery_redlock.redlock import Holder

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")


class FakeLease:
    key = "p:lock:t:{d}"
    lost = False

    def __init__(self, token, pending=None):
        self._token, self._pending = token, pending

    @property
    def fencing_token(self):  # a read would cost a round trip on a lazy lease
        raise AssertionError("tracing must not read fencing_token")


@pytest.fixture
def span():
    provider = sdk_trace.TracerProvider()
    with provider.get_tracer("test").start_as_current_span("run/t") as span:
        yield span
    provider.shutdown()


def test_acquire_outcome_and_release_on_the_current_span(span):
    tracing.acquired("t", FakeLease(42), 0.25)
    tracing.outcome("dropped", "t", "p:lock:t:{e}", Holder("tid|0|h|1|r", 3.0), "why")
    tracing.released("t", FakeLease(42), lost=True)
    names = [e.name for e in span.events]
    assert names == ["redlock.acquired", "redlock.dropped", "redlock.released"]
    assert dict(span.events[0].attributes) == {
        "redlock.lock": "t",
        "redlock.key": "p:lock:t:{d}",
        "redlock.wait_seconds": 0.25,
        "redlock.fencing_token": 42,
    }
    assert dict(span.events[1].attributes) == {
        "redlock.lock": "t",
        "redlock.holder": "tid",
        "redlock.reason": "why",
    }
    assert span.events[2].attributes["redlock.lost"] is True
    assert span.attributes["redlock.outcome"] == "dropped"


def test_a_token_not_yet_written_back_is_left_out(span):
    tracing.acquired("t", FakeLease(None, pending=((0, 1), 7)), 0.0)
    assert "redlock.fencing_token" not in span.events[0].attributes
    assert "redlock.fencing_token" not in span.attributes


def test_no_recording_span_no_work():
    tracing.acquired("t", FakeLease(1), 0.0)  # the default, non-recording span
    tracing.waiting("t", Holder(None, None, "claimant"), 1.0)


def test_without_the_api_nothing_happens(monkeypatch, span):
    monkeypatch.setattr(tracing, "_trace", None)
    tracing.acquired("t", FakeLease(1), 0.0)
    tracing.released("t", FakeLease(1), lost=False)
    assert list(span.events) == []
