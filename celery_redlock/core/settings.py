"""Every setting and lock option, declared once: name, default, check and meaning.

This module is core: it imports neither celery nor kombu. The same
declarations give :class:`~celery_redlock.redlock.Redlock` its defaults and
checks, and :mod:`celery_redlock.conf` the ``app.conf`` settings and the
``lock_*`` task options.

A checker takes a value and returns it normalised, or raises ``ValueError``
with the end of a sentence (``"must be a positive number of seconds"``); the
caller names the setting, the source and the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from .spelling import closest, misspelt_prefix
from .windows import check_rate

__all__ = [
    "BEAT_SETTINGS",
    "EXHAUSTED",
    "POLICIES",
    "SETTINGS",
    "TASK_OPTIONS",
    "WORKER_SETTINGS",
    "Setting",
    "by_name",
    "check_count",
    "check_drift_factor",
    "check_flag",
    "check_key_prefix",
    "check_host",
    "check_limit",
    "check_non_negative",
    "check_port",
    "check_seconds",
    "check_timeout",
    "closest",
    "default",
    "misspelt_prefix",
]

#: What a duplicate execution does while the key is held.
POLICIES = ("drop", "retry", "raise", "wait", "queue", "supersede")
#: What ``retry`` and ``wait`` fall back to when their attempts or time run out.
EXHAUSTED = ("drop", "raise")
#: How long an enqueue claim lives (``None``: no claim).
ENQUEUE = ("until_started", "until_finished")
#: What ``apply_async`` does when another task id holds the claim.
ON_ENQUEUED = ("return", "raise", "replace")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_seconds(value: Any) -> float:
    """A duration: finite and positive (it becomes PX milliseconds or a countdown)."""
    if not _number(value) or not 0 < value < math.inf:
        raise ValueError("must be a positive number of seconds")
    return float(value)


def check_timeout(value: Any) -> float:
    """A time limit: positive; ``float("inf")`` means no limit."""
    if not _number(value) or not value > 0:
        raise ValueError("must be a positive number of seconds")
    return float(value)


def check_non_negative(value: Any) -> float:
    """A time budget that may be spent at once: zero or more; ``float("inf")`` is no limit."""
    if not _number(value) or not value >= 0:
        raise ValueError("must be a non-negative number of seconds")
    return float(value)


def check_drift_factor(value: Any) -> float:
    if not _number(value) or not 0 <= value < 1:
        raise ValueError("must be a number in [0, 1)")
    return float(value)


def check_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a whole number >= 0")
    return value


def check_limit(value: Any) -> int:
    """A concurrency limit: a whole number of permits, at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("must be a whole number >= 1")
    return value


def check_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be True or False")
    return value


def check_port(value: Any) -> int:
    """A TCP port to listen on; ``0`` lets the system pick a free one."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ValueError("must be a TCP port number (0-65535)")
    return value


def check_host(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be an address to bind, such as '127.0.0.1' or '0.0.0.0'")
    return value


def check_key_prefix(value: Any) -> str:
    if not isinstance(value, str) or not value or "{" in value or "}" in value:
        raise ValueError("must be a non-empty string without braces")
    return value


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError("must be one of " + ", ".join(repr(o) for o in options))
        return value

    return check


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def optional(value: Any) -> Any:
        return None if value is None else check(value)

    return optional


# A comma that separates two URLs: the next one starts with a scheme. A comma
# followed by anything else is inside a URL (the hosts of a sentinel:// URL).
_URL_COMMA = re.compile(r"\s*,\s*(?=[A-Za-z][A-Za-z0-9+.-]*://|,|$)")
#: Where a URL starts: its ``scheme://``.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _node_list(value: Any) -> tuple | None:
    """A list of URLs/clients, or one string of URLs separated by commas, spaces
    or semicolons (Celery's spelling of a broker list).

    The commas between the hosts of a ``sentinel://`` URL do not separate nodes.
    A URL that still holds a second ``scheme://`` is refused: two nodes glued
    together would be taken as one, and three configured servers would give
    the safety of one.
    """
    if value is None:
        return None
    if isinstance(value, str):
        parts = value.replace(";", " ").split()
        value = [url for part in parts for url in _URL_COMMA.split(part) if url]
    try:
        nodes = tuple(value)
    except TypeError:
        raise ValueError(
            "must be a list of lock node URLs (redis://, postgresql://, etcd://, ...) "
            "or redis.Redis clients"
        ) from None
    if not nodes:
        raise ValueError("must name at least one lock node")
    for node in nodes:
        if isinstance(node, str) and len(_SCHEME.findall(node)) > 1:
            raise ValueError(
                "holds a node URL with two 'scheme://' in it: separate the nodes with "
                "commas, spaces or ';', or give a list"
            )
    return nodes


class Setting(NamedTuple):
    """One setting: its ``app.conf`` name, default, checker and meaning."""

    name: str
    default: Any
    check: Callable[[Any], Any]
    doc: str

    @property
    def task_attr(self) -> str:
        """The task attribute of the same meaning (``redlock_ttl`` -> ``lock_ttl``)."""
        return "lock_" + self.name[len("redlock_") :]

    @property
    def option(self) -> str:
        """The keyword of :class:`~celery_redlock.redlock.Redlock` (``redlock_ttl`` -> ``ttl``)."""
        return self.name[len("redlock_") :]


#: The settings of the lock: ``app.conf.redlock_*``, task attribute ``lock_*``.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "redlock_nodes",
        None,
        _node_list,
        "Redis masters of the Redlock quorum: a list of URLs (redis://, rediss://, unix://, "
        "sentinel://) or a string of them separated by commas, spaces or ';'. Default: the broker "
        "URL when it is a Redis or Sentinel URL.",
    ),
    Setting(
        "redlock_ttl",
        10.0,
        check_seconds,
        "Lease time in seconds. The heartbeat renews it while the task runs, so it bounds how long "
        "a lock outlives a worker that died, not how long a task may run.",
    ),
    Setting(
        "redlock_node_timeout",
        None,
        _optional(check_seconds),
        "Seconds each node gets to answer one round. Default (None): each node's kind's own, "
        "for what one call costs there: Redis 0.05 (a script in memory), PostgreSQL 0.25 "
        "(a commit), etcd 0.5 (a raft commit). Keep it well under the lock TTL.",
    ),
    Setting(
        "redlock_connect_timeout",
        None,
        _optional(check_seconds),
        "Seconds a new connection to a node gets to open (TCP connect, TLS, AUTH, SELECT, and "
        "a sentinel:// node's lookup), before the node timeout starts for its reply: a busy "
        "host's slow connect is not an outage. Default (None): each node's kind's own, 1 s "
        "for every kind. A node still connecting once a quorum answered does not hold the "
        "round; a round that needs it lasts at most connect_timeout + node_timeout; a node "
        "whose connects time out is then skipped for up to a second at a time, and probed "
        "in the background.",
    ),
    Setting(
        "redlock_drift_factor",
        0.01,
        check_drift_factor,
        "Clock drift allowed, as a fraction of the TTL (plus 2 ms).",
    ),
    Setting(
        "redlock_key_prefix", "redlock", check_key_prefix, "First part of every Redis key written."
    ),
    Setting(
        "redlock_fencing",
        True,
        check_flag,
        "Hand each execution a fencing token that grows with every grant of its key.",
    ),
    Setting(
        "redlock_fence_retention",
        7 * 86400.0,
        check_seconds,
        "Seconds a key's fence value is kept after its last grant.",
    ),
    Setting(
        "redlock_limit",
        1,
        check_limit,
        "At most this many executions of one key at once, each holding a permit (a lease "
        "of its own). 1: a plain lock.",
    ),
    Setting(
        "redlock_min_replicas",
        0,
        check_count,
        "Replicas of each node that must confirm a grant, a renewal, a fence write or a "
        "claim (WAIT, in the same round trip, within the node timeout) before that node "
        "counts. For nodes that are a primary with replicas: a failover then keeps a held "
        "lock in the common case. 0: no WAIT.",
    ),
    Setting(
        "redlock_on_duplicate",
        "drop",
        _choice(POLICIES),
        "What a second execution of a held key does: drop, retry, raise, wait, queue "
        "(every call runs, one at a time, in publish order) or supersede (the newest call "
        "asks the running one to stop, and replaces the waiting ones); see the queues page.",
    ),
    Setting(
        "redlock_retry_backoff",
        1.0,
        check_seconds,
        "First retry delay in seconds; doubles per attempt, with full jitter.",
    ),
    Setting(
        "redlock_retry_backoff_max",
        60.0,
        check_seconds,
        "Largest retry delay in seconds. Keep it below the broker's visibility_timeout.",
    ),
    Setting(
        "redlock_retry_max_attempts",
        20,
        check_count,
        "Contention retries (and outage retries) before giving up; they do not use max_retries.",
    ),
    Setting(
        "redlock_wait_timeout",
        30.0,
        check_timeout,
        "Seconds the wait policy polls for the lock before giving up.",
    ),
    Setting(
        "redlock_on_exhausted",
        "raise",
        _choice(EXHAUSTED),
        "What retry and wait do when their attempts or time run out: raise (the task fails "
        "with LockContended) or drop (REVOKED). Either way it is logged at ERROR.",
    ),
    Setting(
        "redlock_heartbeat_interval",
        None,
        _optional(check_seconds),
        "Seconds between renewals of a held lease. Default: ttl / 3.",
    ),
    Setting(
        "redlock_enqueue",
        None,
        _optional(_choice(ENQUEUE)),
        "Claim the key in apply_async before publishing: until_started (one running, one "
        "waiting) or until_finished (one in the system, queued or running). None: no claim.",
    ),
    Setting(
        "redlock_on_enqueued",
        "return",
        _choice(ON_ENQUEUED),
        "What apply_async does when another task holds the claim: return its AsyncResult, "
        "raise AlreadyEnqueued, or replace it (the replaced message is dropped as superseded).",
    ),
    Setting(
        "redlock_enqueue_ttl",
        3600.0,
        check_seconds,
        "Longest a claim waits for its execution, in seconds, added to the countdown or ETA.",
    ),
    Setting(
        "redlock_debounce",
        None,
        _optional(check_seconds),
        "Seconds a call waits for the next one of its key: each call in a burst replaces the "
        "pending one (newest arguments win) and runs this long after the last. None: off.",
    ),
    Setting(
        "redlock_debounce_max",
        None,
        _optional(check_seconds),
        "Longest a burst can push its run back, in seconds after the burst's first call. "
        "None: no cap.",
    ),
    Setting(
        "redlock_throttle",
        None,
        _optional(check_seconds),
        "At most one execution start per key per this many seconds, a period beginning at "
        "each start. None: off.",
    ),
    Setting(
        "redlock_throttle_trailing",
        True,
        check_flag,
        "Calls inside a throttle period collapse into one run at its end, with the newest "
        "arguments; False drops them.",
    ),
    Setting(
        "redlock_receipt_ttl",
        86400.0,
        check_non_negative,
        "Seconds a task id that finished successfully is remembered, so a later copy of it "
        "(a redelivery, or a delivery while the first still ran) does not run again. "
        "0 turns receipts off.",
    ),
    Setting(
        "redlock_idempotent_ids",
        False,
        check_flag,
        "Treat task ids as idempotency keys: any later message of an id that finished "
        "successfully (a re-sent task_id, a re-applied frozen canvas) is ignored while its "
        "receipt lasts. Off: only copies are, and a new publish runs, as in plain Celery.",
    ),
    Setting(
        "redlock_queue_max",
        0,
        check_count,
        "With lock_on_duplicate='queue': at most this many calls of one key wait; a call "
        "beyond it is answered at once as REVOKED. 0: no bound.",
    ),
    Setting(
        "redlock_queue_retention",
        7 * 86400.0,
        check_seconds,
        "Seconds a key's queue is kept after its last change (a park or a hand-over).",
    ),
    Setting(
        "redlock_rate",
        None,
        check_rate,
        "At most N execution starts per key in any window of a period: '10/s', '100/m', "
        "'1000/h', '20/10s', a (count, seconds) pair, several of them (every window holds), "
        "or a callable of the task's arguments returning one. A start over the limit is "
        "re-published for the first instant the limit admits. None: off.",
    ),
    Setting(
        "redlock_rate_burst",
        1,
        check_limit,
        "How many starts of a rated key may go back to back before the spacing applies.",
    ),
)

#: Settings of the beat de-duplication (app-wide; no task attribute).
BEAT_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "redlock_beat_publish_on_outage",
        False,
        check_flag,
        "Publish a due slot without a claim when the quorum is unavailable (every beat then "
        "sends it); by default the slot is held back and retried while it is still due.",
    ),
    Setting(
        "redlock_beat_min_ttl",
        60.0,
        check_seconds,
        "Floor of a slot claim's lifetime in seconds; a claim lives max(this, 2 * period).",
    ),
    Setting(
        "redlock_beat_retry_interval",
        1.0,
        check_seconds,
        "Seconds between claim attempts of a slot held back by an outage.",
    ),
)

#: Settings of the worker as a whole (app-wide; no task attribute).
WORKER_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "redlock_metrics_port",
        None,
        _optional(check_port),
        "Port on which the worker's main process serves /metrics (Prometheus) for itself and "
        "every pool child, added up. None: no endpoint. Needs prometheus_client.",
    ),
    Setting(
        "redlock_metrics_host",
        "127.0.0.1",
        check_host,
        "Address the metrics endpoint binds. Loopback by default; '0.0.0.0' (or '::') lets a "
        "scraper on another host or container reach it.",
    ),
)

#: Task options that are not settings (no ``app.conf`` key): name -> meaning.
#: Their checks live where they are used (the key builder at bind time).
TASK_OPTIONS: dict[str, str] = {
    "lock_on": "Which arguments make the key: parameter names, dotted paths, a mapping of "
    "them to functions applied first, a callable, or ().",
    "lock_name": "Name of the lock (default: the task name).",
    "lock_token_arg": "Keyword the fencing token is passed as, when run declares it.",
    "lock_also": "Named limits held together with the task's own key: {name: limit}, or "
    "names (limit 1 each); each name is the key of a task with that lock_name and lock_on=(). "
    "A rate instead of a limit ({name: '100/s'}) shares that name's rate.",
}

_BY_NAME = {s.name: s for s in SETTINGS + BEAT_SETTINGS + WORKER_SETTINGS}


def by_name(name: str) -> Setting:
    """The declaration of one setting, by its ``app.conf`` name.

    Raises:
        KeyError: no such setting.
    """
    return _BY_NAME[name]


def default(name: str) -> Any:
    """The default of a setting, by its ``app.conf`` name."""
    return _BY_NAME[name].default
