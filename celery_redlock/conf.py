"""Every setting, declared once: name, default, validation and meaning.

Settings are lowercase ``redlock_*`` keys in ``app.conf`` (with Django's
``namespace="CELERY"``, ``CELERY_REDLOCK_NODES`` and so on). Each has a task
attribute of the same meaning, ``lock_*``, which wins over ``app.conf`` for
that task::

    app.conf.redlock_nodes = ["redis://r1:6379/0", "redis://r2:6379/0", "redis://r3:6379/0"]

    @app.task(base=LockedTask, lock_ttl=60, lock_on_duplicate="retry")
    def settle(account_id): ...

Values are checked when the task binds; a bad one raises
:class:`~celery_redlock.exceptions.ConfigurationError` (an
``ImproperlyConfigured``) naming the task, the setting and the value.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from .exceptions import ConfigurationError
from .redlock import Redlock

__all__ = [
    "BEAT_SETTINGS",
    "EXHAUSTED",
    "LockSettings",
    "POLICIES",
    "SETTINGS",
    "Setting",
    "nodes_from_app",
    "redlock_for",
    "resolve",
    "resolve_beat",
]

#: What a duplicate execution does while the key is held.
POLICIES = ("drop", "retry", "raise", "wait")
#: What ``retry`` and ``wait`` fall back to when their attempts or time run out.
EXHAUSTED = ("drop", "raise")


def _positive(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("must be a positive number of seconds")
    return float(value)


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError("must be a number in [0, 1)")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a whole number >= 0")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be True or False")
    return value


def _prefix(value: Any) -> str:
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


def _node_list(value: Any) -> tuple | None:
    """A list of URLs/clients, or one string of URLs separated by commas or spaces."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    try:
        nodes = tuple(value)
    except TypeError:
        raise ValueError("must be a list of Redis URLs or clients") from None
    if not nodes:
        raise ValueError("must name at least one Redis node")
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


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "redlock_nodes",
        None,
        _node_list,
        "Redis masters of the Redlock quorum: a list of URLs (redis://, rediss://, unix://) "
        "or a string of them separated by commas. Default: the broker URL when it is a Redis URL.",
    ),
    Setting(
        "redlock_ttl",
        10.0,
        _positive,
        "Lease time in seconds. The heartbeat renews it while the task runs, so it bounds how long "
        "a lock outlives a worker that died, not how long a task may run.",
    ),
    Setting(
        "redlock_node_timeout",
        0.05,
        _positive,
        "Seconds each node gets to answer one round. Keep it well under ttl * drift_factor.",
    ),
    Setting(
        "redlock_drift_factor",
        0.01,
        _fraction,
        "Clock drift allowed, as a fraction of the TTL (plus 2 ms).",
    ),
    Setting("redlock_key_prefix", "redlock", _prefix, "First part of every Redis key written."),
    Setting(
        "redlock_fencing",
        True,
        _flag,
        "Hand each execution a fencing token that grows with every grant of its key.",
    ),
    Setting(
        "redlock_fence_retention",
        7 * 86400.0,
        _positive,
        "Seconds a key's fence value is kept after its last grant.",
    ),
    Setting(
        "redlock_on_duplicate",
        "drop",
        _choice(POLICIES),
        "What a second execution of a held key does: drop, retry, raise or wait.",
    ),
    Setting(
        "redlock_retry_backoff",
        1.0,
        _positive,
        "First retry delay in seconds; doubles per attempt, with full jitter.",
    ),
    Setting(
        "redlock_retry_backoff_max",
        60.0,
        _positive,
        "Largest retry delay in seconds. Keep it below the broker's visibility_timeout.",
    ),
    Setting(
        "redlock_retry_max_attempts",
        20,
        _count,
        "Contention retries (and outage retries) before giving up; they do not use max_retries.",
    ),
    Setting(
        "redlock_wait_timeout",
        30.0,
        _positive,
        "Seconds the wait policy polls for the lock before giving up.",
    ),
    Setting(
        "redlock_on_exhausted",
        "drop",
        _choice(EXHAUSTED),
        "What retry and wait do when their attempts or time run out: drop or raise.",
    ),
    Setting(
        "redlock_heartbeat_interval",
        None,
        _optional(_positive),
        "Seconds between renewals of a held lease. Default: ttl / 3.",
    ),
)

#: Settings of the beat de-duplication (app-wide; no task attribute).
BEAT_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "redlock_beat_publish_on_outage",
        False,
        _flag,
        "Publish a due slot without a claim when the quorum is unavailable (every beat then "
        "sends it); by default the slot is held back and retried while it is still due.",
    ),
    Setting(
        "redlock_beat_min_ttl",
        60.0,
        _positive,
        "Floor of a slot claim's lifetime in seconds; a claim lives max(this, 2 * period).",
    ),
    Setting(
        "redlock_beat_retry_interval",
        1.0,
        _positive,
        "Seconds between claim attempts of a slot held back by an outage.",
    ),
)

_BY_NAME = {s.name: s for s in SETTINGS + BEAT_SETTINGS}


def resolve_beat(app: Any, owner: str = "beat") -> dict[str, Any]:
    """The beat settings of ``app``, checked: ``{name: value}``.

    Raises:
        ConfigurationError: a value is invalid.
    """
    values = {}
    for setting in BEAT_SETTINGS:
        value = app.conf.get(setting.name)
        try:
            values[setting.name] = setting.default if value is None else setting.check(value)
        except ValueError as exc:
            raise ConfigurationError(
                f"{owner}: app.conf.{setting.name} = {value!r} {exc}"
            ) from None
    return values


@dataclass(frozen=True)
class LockSettings:
    """The resolved settings of one task (or of beat)."""

    nodes: tuple
    ttl: float
    node_timeout: float
    drift_factor: float
    key_prefix: str
    fencing: bool
    fence_retention: float
    on_duplicate: str
    retry_backoff: float
    retry_backoff_max: float
    retry_max_attempts: int
    wait_timeout: float
    on_exhausted: str
    heartbeat_interval: float

    def redlock_options(self) -> dict[str, Any]:
        return {
            "node_timeout": self.node_timeout,
            "drift_factor": self.drift_factor,
            "key_prefix": self.key_prefix,
            "fencing": self.fencing,
            "fence_retention": self.fence_retention,
        }


def resolve(
    app: Any, overrides: Mapping[str, Any] | None = None, owner: str = "app.conf"
) -> LockSettings:
    """Resolve every setting: ``overrides`` (task attributes), then ``app.conf``, then the default.

    Args:
        app: the Celery app.
        overrides: ``lock_*`` attribute values; None means "not set".
        owner: named in error messages (the task name).

    Raises:
        ConfigurationError: a value is invalid, or no Redis node can be found.
    """
    overrides = overrides or {}
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        value = overrides.get(setting.task_attr)
        source = f"{owner}.{setting.task_attr}"
        if value is None:
            value = app.conf.get(setting.name)
            source = f"app.conf.{setting.name}"
        if value is None:
            value = setting.default
            source = f"default {setting.name}"
        try:
            values[setting.name[len("redlock_") :]] = setting.check(value)
        except ValueError as exc:
            raise ConfigurationError(f"{owner}: {source} = {value!r} {exc}") from None
    if values["nodes"] is None:
        values["nodes"] = nodes_from_app(app, owner)
    if values["heartbeat_interval"] is None:
        values["heartbeat_interval"] = values["ttl"] / 3
    elif values["heartbeat_interval"] >= values["ttl"]:
        raise ConfigurationError(
            f"{owner}: heartbeat interval {values['heartbeat_interval']}s must be shorter than "
            f"the lock TTL {values['ttl']}s, or the lease lapses between renewals"
        )
    if values["node_timeout"] >= values["ttl"]:
        raise ConfigurationError(
            f"{owner}: node timeout {values['node_timeout']}s must be shorter than "
            f"the lock TTL {values['ttl']}s"
        )
    return LockSettings(**values)


def nodes_from_app(app: Any, owner: str = "app.conf") -> tuple:
    """The broker URL as the one Redlock node, when it is a Redis URL."""
    broker = app.conf.broker_url
    if isinstance(broker, str) and broker.split("://", 1)[0] in ("redis", "rediss"):
        return (broker.split(";", 1)[0],)
    raise ConfigurationError(
        f"{owner}: set app.conf.redlock_nodes (a list of Redis URLs); the broker "
        f"{_scheme(broker)} is not Redis, so it cannot serve as the default lock node"
    )


def _scheme(url: Any) -> str:
    return f"{url.split('://', 1)[0]}://..." if isinstance(url, str) and "://" in url else repr(url)


# One Redlock per app and node configuration, so every task sharing the nodes
# shares the connections. Weak on the app: no state is set on foreign objects.
_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_clients_lock = threading.Lock()


def redlock_for(app: Any, settings: LockSettings) -> Redlock:
    """The shared :class:`Redlock` of ``app`` for these settings' nodes and options."""
    options = settings.redlock_options()
    cache_key = (
        tuple(n if isinstance(n, str) else id(n) for n in settings.nodes),
        tuple(sorted(options.items())),
    )
    with _clients_lock:
        per_app = _clients.setdefault(app, {})
        client = per_app.get(cache_key)
        if client is None:
            client = per_app[cache_key] = Redlock(settings.nodes, **options)
        return client


def setting(name: str) -> Setting:
    """The declaration of one setting, by its ``app.conf`` name."""
    return _BY_NAME[name]
