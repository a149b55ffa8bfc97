"""The lock's story on the current OpenTelemetry span, when ``opentelemetry-api`` is installed.

With the ``otel`` extra (``pip install 'celery_redlock[otel]'``) and a tracer
configured (for instance ``opentelemetry-instrumentation-celery``, whose task
span is the current span while a task runs), every locked execution adds to
that span:

Events (each with the ``redlock.lock`` attribute, the lock name):

``redlock.waiting``
    The key is held and this execution polls for it (policy ``wait``, a
    redelivered copy, a designated run in eager mode): ``redlock.holder``,
    ``redlock.timeout`` (seconds).
``redlock.acquired``
    The lease is granted: ``redlock.key``, ``redlock.wait_seconds`` (time to
    take it, waits included), ``redlock.fencing_token`` (when already known:
    the body takes it as an argument, or the nodes agreed at once).
``redlock.dropped`` / ``redlock.retried`` / ``redlock.raised`` / ``redlock.ignored``
    The contention outcome when the body does not run: ``redlock.holder`` (the
    holding task id or owner), ``redlock.reason``.
``redlock.rate_delayed``
    A rate limit moved the start back: ``redlock.delay_seconds``,
    ``redlock.start_at`` (the booked instant, epoch seconds).
``redlock.released``
    The body ended and the lease was released: ``redlock.lost`` (True if a
    renewal had failed or the lease lapsed before the end),
    ``redlock.fencing_token`` if known by then (the body read it).

Span attributes (the summary a trace search filters on): ``redlock.lock``,
``redlock.key``, ``redlock.outcome`` (``acquired``, ``dropped``, ``retried``,
``raised``, ``ignored``), ``redlock.fencing_token``, ``redlock.wait_seconds``.

No argument value is ever recorded (the key is a digest). Without the API, or
without a recording span, every function here returns at once. This module is
core: it imports neither celery nor kombu.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ENABLED",
    "acquired",
    "known_token",
    "outcome",
    "rate_delayed",
    "released",
    "waiting",
]

_trace: Any
try:  # optional: the ``otel`` extra
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - depends on the installed extras
    _trace = None

#: Whether ``opentelemetry-api`` is importable here.
ENABLED = _trace is not None


def _span() -> Any:
    if _trace is None:
        return None
    span = _trace.get_current_span()
    return span if span.is_recording() else None


def _attrs(values: dict[str, Any]) -> dict[str, Any]:
    return {f"redlock.{k}": v for k, v in values.items() if v is not None}


def known_token(lease: Any) -> int | None:
    """The lease's fencing token if already known, without the round a first read
    of a lazy lease's ``fencing_token`` costs (tracing must not add a round trip)."""
    if getattr(lease, "_pending", None):
        return None
    return getattr(lease, "_token", None)


def _who(holder: Any) -> str | None:
    """The holding task id, else its owner value, else the claiming task id."""
    if holder is None:
        return None
    return holder.task_id or holder.owner or holder.claimant


def waiting(lock: str, holder: Any, timeout: float) -> None:
    """The key is held: this execution starts polling for up to ``timeout`` seconds."""
    span = _span()
    if span is not None:
        span.add_event(
            "redlock.waiting", _attrs(dict(lock=lock, holder=_who(holder), timeout=timeout))
        )


def acquired(lock: str, lease: Any, wait_seconds: float) -> None:
    """The lease is granted (event and span attributes)."""
    span = _span()
    if span is None:
        return
    values = dict(
        lock=lock, key=lease.key, wait_seconds=wait_seconds, fencing_token=known_token(lease)
    )
    span.add_event("redlock.acquired", _attrs(values))
    span.set_attributes(_attrs(dict(values, outcome="acquired")))


def outcome(name: str, lock: str, key: str | None, holder: Any, reason: str = "") -> None:
    """The body does not run: dropped, retried, raised or ignored."""
    span = _span()
    if span is None:
        return
    span.add_event(
        f"redlock.{name}", _attrs(dict(lock=lock, holder=_who(holder), reason=reason or None))
    )
    span.set_attributes(_attrs(dict(lock=lock, key=key, outcome=name)))


def released(lock: str, lease: Any, lost: bool) -> None:
    """The lease was released after the body; ``lost``: it was lost before the release."""
    span = _span()
    if span is None:
        return
    token = known_token(lease)
    span.add_event("redlock.released", _attrs(dict(lock=lock, lost=lost, fencing_token=token)))
    if token is not None:
        span.set_attribute("redlock.fencing_token", token)


def rate_delayed(lock: str, delay: float, start_at: float) -> None:
    """A rate limit moved this start back by ``delay`` seconds, to ``start_at``."""
    span = _span()
    if span is not None:
        values = dict(lock=lock, delay_seconds=delay, start_at=start_at)
        span.add_event("redlock.rate_delayed", _attrs(values))
