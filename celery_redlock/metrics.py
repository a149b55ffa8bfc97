"""Counters and timings of what the locks do.

Always kept in process (:func:`snapshot`, used by tests and the CLI), and also
exported to Prometheus when ``prometheus_client`` is installed (the
``prometheus`` extra)::

    celery_redlock_events_total{event="acquired", lock="tasks.settle"}
    celery_redlock_acquire_seconds{lock="tasks.settle"}       (histogram)

Events: ``acquired``, ``contended``, ``dropped``, ``retried``, ``raised``,
``waited``, ``exhausted``, ``gave_up``, ``lost``, ``outage``, ``unhealed`` (an
attempt kept because nodes need a fix), ``parent_released``,
``beat_sent``, ``beat_skipped``, ``beat_outage``, ``beat_missed``. The ``lock``
label is the task's ``lock_name`` (the entry name for beat events), never an
argument value, so its cardinality is that of your task list.

In a prefork worker every child process counts for itself. Set
``redlock_metrics_port`` and the worker's main process serves ``/metrics`` for
all of them (:class:`Exporter`): before the pool forks it turns on
``prometheus_client``'s multiprocess mode in a directory of its own, so each
child writes its counts to files there and one scrape adds them up. Counts of
children that exited (``worker_max_tasks_per_child``, a killed child) stay in
the sums, as counters should. :class:`Exporter` is usable without Celery, in
any program that forks workers.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
from collections import Counter
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

__all__ = [
    "EVENTS",
    "Exporter",
    "count",
    "observe",
    "observe_queue_wait",
    "observe_rate_delay",
    "reset",
    "snapshot",
]

logger = logging.getLogger("celery_redlock.metrics")

EVENTS = (
    "acquired",
    "contended",
    "dropped",
    "retried",
    "raised",
    "waited",
    "exhausted",
    "gave_up",
    "lost",
    "outage",
    "unhealed",
    "parent_released",
    "beat_sent",
    "beat_skipped",
    "beat_outage",
    "beat_missed",
    "rate_delayed",
    "rate_outage",
    "rate_split",
    "queued",
    "queue_full",
    "handed_over",
    "superseded",
)

_counts: Counter = Counter()
_lock = threading.Lock()

_prom: Any
try:  # optional export
    import prometheus_client as _prom
except ImportError:  # pragma: no cover - depends on the installed extras
    _prom = None

_EVENTS: Any = None
_ACQUIRE: Any = None
_RATE_DELAY: Any = None
_QUEUE_WAIT: Any = None


def _create_metrics() -> None:
    """(Re)create the two metrics on the default registry, with the value class
    ``prometheus_client`` uses now (per process, or files in multiprocess mode)."""
    global _EVENTS, _ACQUIRE, _RATE_DELAY, _QUEUE_WAIT
    for metric in (_EVENTS, _ACQUIRE, _RATE_DELAY, _QUEUE_WAIT):
        if metric is not None:
            _prom.REGISTRY.unregister(metric)
    _event_children.clear()
    _acquire_children.clear()
    _rate_delay_children.clear()
    _queue_wait_children.clear()
    _EVENTS = _prom.Counter(
        "celery_redlock_events", "Lock events by kind and lock name", ("event", "lock")
    )
    _ACQUIRE = _prom.Histogram(
        "celery_redlock_acquire_seconds",
        "Time to take a lock (one quorum round, or two with fencing)",
        ("lock",),
        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    )
    _RATE_DELAY = _prom.Histogram(
        "celery_redlock_rate_delay_seconds",
        "How far a rate limit moved a start back (delayed starts only)",
        ("lock",),
        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0),
    )
    _QUEUE_WAIT = _prom.Histogram(
        "celery_redlock_queue_wait_seconds",
        "How long a queued call waited in its key's queue, parked to started",
        ("lock",),
        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0),
    )


# Labelled children, looked up once per label set: ``labels()`` costs more than
# the update itself, and these are updated on every task. Prometheus keeps the
# same child per label set, so a cached one is the one it exports.
_event_children: dict[tuple[str, str], Any] = {}
_acquire_children: dict[str, Any] = {}
_rate_delay_children: dict[str, Any] = {}
_queue_wait_children: dict[str, Any] = {}

if _prom is not None:
    _create_metrics()


def _child(children: dict[Any, Any], labels: Any, metric: Any) -> Any:
    """``metric``'s child of ``labels`` (a lock, or a tuple of label values), cached."""
    child = children.get(labels)
    if child is None:
        values = labels if isinstance(labels, tuple) else (labels,)
        child = children[labels] = metric.labels(*values)
    return child


def count(event: str, lock: str) -> None:
    """Count one ``event`` of ``lock``."""
    key = (event, lock)
    with _lock:
        _counts[key] += 1
    if _prom is not None:
        _child(_event_children, key, _EVENTS).inc()


def observe(seconds: float, lock: str) -> None:
    """Record how long one acquisition took."""
    if _prom is not None:
        _child(_acquire_children, lock, _ACQUIRE).observe(seconds)


def observe_rate_delay(seconds: float, lock: str) -> None:
    """Record how far a rate limit moved one start back."""
    if _prom is not None:
        _child(_rate_delay_children, lock, _RATE_DELAY).observe(seconds)


def observe_queue_wait(seconds: float, lock: str) -> None:
    """Record how long one queued call waited, from its park to its start."""
    if _prom is not None:
        _child(_queue_wait_children, lock, _QUEUE_WAIT).observe(seconds)


def snapshot() -> dict[str, dict[str, Any]]:
    """This process's counts: ``{event: {lock: n}}``."""
    out: dict[str, dict[str, Any]] = {}
    with _lock:
        for (event, lock), n in _counts.items():
            out.setdefault(event, {})[lock] = n
    return out


def reset() -> None:
    """Forget this process's counts (Prometheus counters are monotonic and stay)."""
    with _lock:
        _counts.clear()


# -- one endpoint for every process of a prefork worker ----------------------------

#: The variable ``prometheus_client`` reads to find its multiprocess directory.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


class Exporter:
    """Serve ``/metrics`` over HTTP for this process and every process it forks later.

    Create it in the parent **before** forking (a Celery worker does it on
    ``worker_init`` when ``redlock_metrics_port`` is set). It turns on
    ``prometheus_client``'s multiprocess mode: ``$PROMETHEUS_MULTIPROC_DIR`` if
    set (then left as it is at close), else a new temporary directory (removed
    at close); every process counts into files there, and each scrape sums
    them (``MultiProcessCollector``).

    Args:
        port: TCP port; ``0`` picks a free one (see :attr:`port`).
        host: address to bind. Default loopback: set ``"0.0.0.0"`` (or ``"::"``)
            for a scraper on another host or in another container.

    Raises:
        RuntimeError: ``prometheus_client`` is not installed.
        OSError: the port cannot be bound.
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        if _prom is None:
            raise RuntimeError(
                "serving metrics needs prometheus_client: pip install 'celery_redlock[prometheus]'"
            )
        from prometheus_client import multiprocess

        self._multiprocess = multiprocess
        given = os.environ.get(MULTIPROC_ENV)
        self.owns_directory = not given
        self.directory: str = given or tempfile.mkdtemp(prefix="celery_redlock-metrics-")
        os.environ[MULTIPROC_ENV] = self.directory
        self._switched = _use_multiprocess_values(True)
        registry = _prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.directory)
        server_class = _Server6 if ":" in host else _Server
        self._server: _Server | None
        try:
            self._server = make_server(
                host, port, _prom.make_wsgi_app(registry), server_class, _QuietHandler
            )
        except BaseException:
            self._forget_directory()
            raise
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="celery_redlock-metrics", daemon=True
        )
        self._thread.start()
        logger.info(
            "serving lock metrics of every worker process on http://%s:%d/metrics (%s)",
            host,
            self.port,
            self.directory,
        )

    def mark_dead(self, pid: int) -> None:
        """Tell ``prometheus_client`` that process ``pid`` is gone (its counts stay)."""
        self._multiprocess.mark_process_dead(pid, self.directory)

    def close(self) -> None:
        """Stop serving; remove the directory if this exporter made it. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self._thread.join(5)
        self._forget_directory()

    def _forget_directory(self) -> None:
        if self._switched:
            _use_multiprocess_values(False)
        if self.owns_directory:
            if os.environ.get(MULTIPROC_ENV) == self.directory:
                del os.environ[MULTIPROC_ENV]
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _use_multiprocess_values(on: bool) -> bool:
    """Make this process's metrics (and those of its later forks) count into files,
    or (``on=False``) back in memory. Returns whether it switched.

    ``prometheus_client`` picks its value class once, when first imported,
    from ``$PROMETHEUS_MULTIPROC_DIR``; it was imported with this module,
    usually long before a worker knows its settings. So the class is switched
    here (``prometheus_client.values.ValueClass``, a public name though not a
    documented one: this function is the one place that relies on it, and
    ``tests/unit/test_metrics.py`` checks it) and the two metrics are made again.
    """
    from prometheus_client import values

    in_files = values.ValueClass is not values.MutexValue
    if in_files == on:
        return False
    values.ValueClass = values.MultiProcessValue() if on else values.MutexValue
    with _lock:
        _create_metrics()
    return True
