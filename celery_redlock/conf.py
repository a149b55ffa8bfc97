"""Every setting, declared once: name, default, validation and meaning.

Settings are lowercase ``redlock_*`` keys in ``app.conf`` (with Django's
``namespace="CELERY"``, ``CELERY_REDLOCK_NODES`` and so on). Each has a task
attribute of the same meaning, ``lock_*``, which wins over ``app.conf`` for
that task::

    app.conf.redlock_nodes = ["redis://r1:6379/0", "redis://r2:6379/0", "redis://r3:6379/0"]

    @app.task(base=LockedTask, lock_ttl=60, lock_on_duplicate="retry")
    def settle(account_id): ...

The declarations (name, default, check, meaning) live in the Celery-free
:mod:`celery_redlock.settings`, which also gives :class:`Redlock` its defaults
and checks; this module resolves them against ``app.conf`` and task attributes.

Values are checked when the task binds; a bad one raises
:class:`ImproperlyConfigured` (a :class:`~celery_redlock.ConfigurationError`
and a Celery ``ImproperlyConfigured``) naming the task, the setting as the
configuration spells it (:func:`spelt`) and the value. So does a ``lock_*``
task option or ``redlock_*`` key that is not declared (a misspelling), or a
key that names a setting under a misspelt prefix, naming the one meant.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from celery import exceptions as celery_exceptions
from celery.app.defaults import NAMESPACES, flatten

from . import exceptions
from .core import Redlock, default_timeouts, mask_url
from .sentinel_broker import sentinel_node
from .settings import (
    BEAT_SETTINGS,
    EXHAUSTED,
    POLICIES,
    SETTINGS,
    TASK_OPTIONS,
    WORKER_SETTINGS,
    Setting,
    by_name,
    closest,
    misspelt_prefix,
)

__all__ = [
    "BEAT_SETTINGS",
    "EXHAUSTED",
    "ImproperlyConfigured",
    "LockSettings",
    "POLICIES",
    "SETTINGS",
    "TASK_OPTIONS",
    "WORKER_SETTINGS",
    "Setting",
    "bind_errors",
    "check_app_names",
    "check_task_names",
    "nodes_from_app",
    "redlock_for",
    "resolve",
    "resolve_beat",
    "resolve_worker",
    "spelt",
]


class ImproperlyConfigured(exceptions.ConfigurationError, celery_exceptions.ImproperlyConfigured):
    """A bind-time or ``app.conf`` error.

    Both a :class:`~celery_redlock.ConfigurationError` and Celery's
    ``ImproperlyConfigured``: either ``except`` catches it.
    """


@contextlib.contextmanager
def bind_errors() -> Iterator[None]:
    """Re-raise a ConfigurationError raised inside as :class:`ImproperlyConfigured`."""
    try:
        yield
    except ImproperlyConfigured:
        raise
    except exceptions.ConfigurationError as exc:
        raise ImproperlyConfigured(str(exc)) from exc


#: Every ``lock_*`` task option: the settings' attributes and the task-only options.
TASK_ATTRS: frozenset[str] = frozenset([s.task_attr for s in SETTINGS] + list(TASK_OPTIONS))
#: Celery's own settings: never a misspelt ``redlock_*`` key.
CELERY_SETTINGS: frozenset[str] = frozenset(key for key, _ in flatten(NAMESPACES))
#: Every declared ``redlock_*`` key of ``app.conf``.
APP_SETTINGS: frozenset[str] = frozenset(s.name for s in SETTINGS + BEAT_SETTINGS + WORKER_SETTINGS)


def _did_you_mean(name: str, declared: frozenset[str], upper_prefix: str | None = None) -> str:
    """``"; did you mean 'x'?"`` for the closest declared name (upper case after a prefix)."""
    guess = closest(name, declared)
    if guess is None:
        return ""
    shown = guess if upper_prefix is None else upper_prefix + guess.upper()
    return f"; did you mean {shown!r}?"


def check_task_names(cls: type, owner: str) -> None:
    """Fail on a ``lock_*`` attribute of a task class that is not a declared option.

    ``@app.task(base=LockedTask, lock_on_duplicat="retry")`` sets that attribute:
    without this check the task would bind and silently drop what it was meant to retry.

    Raises:
        ImproperlyConfigured: naming the closest declared option.
    """
    for attr in sorted(dir(cls)):
        if attr.startswith("lock_") and attr not in TASK_ATTRS:
            raise ImproperlyConfigured(
                f"{owner}: task option {attr!r} is not a celery_redlock option"
                + _did_you_mean(attr, TASK_ATTRS)
            )


def check_app_names(app: Any, owner: str = "app.conf") -> None:
    """Fail on a ``redlock_*`` key of ``app.conf`` that is not a declared setting,
    or on a key that names one under a misspelt prefix (``redlok_nodes``,
    ``redis_lock_ttl``: :func:`~celery_redlock.settings.misspelt_prefix`; never
    one of Celery's own settings). Also in Django's namespaced form
    (``CELERY_REDLOCK_TLL``, ``CELERY_REDLOK_NODES``).

    Raises:
        ImproperlyConfigured: naming the closest declared setting, as spelt in ``app.conf``.
    """
    namespace = getattr(app, "namespace", None)
    upper_prefix = f"{namespace}_" if namespace else ""
    for key in sorted(k for k in app.conf.keys() if isinstance(k, str)):
        if key.islower():
            name, spelt_upper = key, None
        elif key.startswith(upper_prefix):
            name, spelt_upper = key[len(upper_prefix) :].lower(), upper_prefix
        else:
            continue  # outside the namespace: Django's own settings, the project's
        if name.startswith("redlock_"):
            if name in APP_SETTINGS:
                continue
            hint = _did_you_mean(name, APP_SETTINGS, spelt_upper)
        elif name in CELERY_SETTINGS or (meant := misspelt_prefix(name, APP_SETTINGS)) is None:
            continue
        else:
            hint = " (a misspelt prefix)" + _did_you_mean(meant, frozenset([meant]), spelt_upper)
        raise ImproperlyConfigured(
            f"{owner}: app.conf key {key!r} is not a celery_redlock setting" + hint
        )


def spelt(app: Any, name: str) -> str:
    """The setting ``name`` as the configuration of ``app`` spells it, for messages:
    ``CELERY_REDLOCK_TTL`` with Django's settings (``namespace="CELERY"``)
    unless ``app.conf.redlock_ttl`` itself was set, else ``app.conf.redlock_ttl``."""
    namespace = getattr(app, "namespace", None)
    if not namespace:
        return f"app.conf.{name}"
    prefixed = f"{namespace}_{name}"
    prefixed = prefixed.upper() if namespace.isupper() else prefixed
    for mapping in getattr(app.conf, "maps", ()):
        if prefixed in mapping:
            return prefixed
        if name in mapping:
            return f"app.conf.{name}"
    return prefixed


def resolve_beat(app: Any, owner: str = "beat") -> dict[str, Any]:
    """The beat settings of ``app``, checked: ``{name: value}``.

    Raises:
        ImproperlyConfigured: a value is invalid, or a ``redlock_*`` key is not a setting.
    """
    return _resolve_app(app, BEAT_SETTINGS, owner)


def resolve_worker(app: Any, owner: str = "worker") -> dict[str, Any]:
    """The worker settings of ``app`` (:data:`WORKER_SETTINGS`), checked: ``{name: value}``.

    Raises:
        ImproperlyConfigured: a value is invalid, or a ``redlock_*`` key is not a setting.
    """
    return _resolve_app(app, WORKER_SETTINGS, owner)


def _resolve_app(app: Any, declared: tuple[Setting, ...], owner: str) -> dict[str, Any]:
    check_app_names(app, owner)
    values = {}
    for setting in declared:
        value = app.conf.get(setting.name)
        try:
            values[setting.name] = setting.default if value is None else setting.check(value)
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{owner}: {spelt(app, setting.name)} = {value!r} {exc}"
            ) from None
    return values


@dataclass(frozen=True)
class LockSettings:
    """The resolved settings of one task (or of beat)."""

    #: None only in a task's plan bound to an app with no lock nodes yet (see LockPlan).
    nodes: tuple | None
    ttl: float
    #: None: unset, each node's kind's default (see :meth:`effective_node_timeout`).
    node_timeout: float | None
    connect_timeout: float | None
    drift_factor: float
    key_prefix: str
    fencing: bool
    fence_retention: float
    limit: int
    min_replicas: int
    on_duplicate: str
    retry_backoff: float
    retry_backoff_max: float
    retry_max_attempts: int
    wait_timeout: float
    on_exhausted: str
    heartbeat_interval: float
    enqueue: str | None
    on_enqueued: str
    enqueue_ttl: float
    debounce: float | None
    debounce_max: float | None
    throttle: float | None
    throttle_trailing: bool
    receipt_ttl: float
    idempotent_ids: bool
    queue_max: int = 0
    queue_retention: float = 7 * 86400.0
    rate: Any = None
    rate_burst: int = 1

    @property
    def node_list(self) -> tuple:
        """The lock nodes; the settings of a plan's ``resolved`` always have them."""
        if self.nodes is None:
            raise ImproperlyConfigured("the lock nodes are not resolved yet")
        return self.nodes

    def effective_node_timeout(self) -> float:
        """The node timeout the rounds use: the one set, or else the longest of the
        defaults of the nodes' kinds."""
        if self.node_timeout is not None:
            return self.node_timeout
        return default_timeouts(self.nodes or ())[0]

    def redlock_options(self) -> dict[str, Any]:
        return {
            "node_timeout": self.node_timeout,
            "connect_timeout": self.connect_timeout,
            "drift_factor": self.drift_factor,
            "key_prefix": self.key_prefix,
            "fencing": self.fencing,
            "fence_retention": self.fence_retention,
            "min_replicas": self.min_replicas,
        }


def resolve(
    app: Any,
    overrides: Mapping[str, Any] | None = None,
    owner: str = "app.conf",
    defer_nodes: bool = False,
) -> LockSettings:
    """Resolve every setting: ``overrides`` (task attributes), then ``app.conf``, then the default.

    Args:
        app: the Celery app.
        overrides: ``lock_*`` attribute values; None means "not set".
        owner: named in error messages (the task name).

    Raises:
        ImproperlyConfigured: a value is invalid, a ``redlock_*`` key is not a
            setting, or no Redis node can be found.
    """
    check_app_names(app, owner)
    overrides = overrides or {}
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        value = overrides.get(setting.task_attr)
        source = f"{owner}.{setting.task_attr}"
        if value is None:
            value = app.conf.get(setting.name)
            source = spelt(app, setting.name)
        if value is None:
            value = setting.default
            source = f"default {setting.name}"
        try:
            values[setting.name[len("redlock_") :]] = setting.check(value)
        except ValueError as exc:
            shown = mask_url(repr(value))  # a node URL's password stays out of the message
            raise ImproperlyConfigured(f"{owner}: {source} = {shown} {exc}") from None
    if values["nodes"] is None and not (defer_nodes and not _has_lock_nodes(app)):
        values["nodes"] = nodes_from_app(app, owner)
    if values["heartbeat_interval"] is None:
        values["heartbeat_interval"] = values["ttl"] / 3
    elif values["heartbeat_interval"] >= values["ttl"]:
        raise ImproperlyConfigured(
            f"{owner}: heartbeat interval {values['heartbeat_interval']}s must be shorter than "
            f"the lock TTL {values['ttl']}s, or the lease lapses between renewals"
        )
    if values["debounce"] is not None and values["throttle"] is not None:
        raise ImproperlyConfigured(
            f"{owner}: lock_debounce and lock_throttle exclude each other: a debounced key "
            "runs after a quiet spell, a throttled key at most once per period; choose one"
        )
    if values["debounce_max"] is not None and (
        values["debounce"] is None or values["debounce_max"] < values["debounce"]
    ):
        raise ImproperlyConfigured(
            f"{owner}: lock_debounce_max {values['debounce_max']}s needs lock_debounce set "
            f"and at least as long (lock_debounce = {values['debounce']})"
        )
    node_timeout, which = values["node_timeout"], "node timeout"
    if node_timeout is None and values["nodes"] is not None:
        with contextlib.suppress(ImportError):  # a missing driver is reported at the node's build
            node_timeout = default_timeouts(values["nodes"])[0]
        which = "default node timeout of the nodes' kind (redlock_node_timeout unset)"
    if node_timeout is not None and node_timeout >= values["ttl"]:
        raise ImproperlyConfigured(
            f"{owner}: {which} {node_timeout:g}s must be shorter than "
            f"the lock TTL {values['ttl']:g}s"
        )
    return LockSettings(**values)


def nodes_from_broker(app: Any, task: Any = None) -> bool:
    """Whether the lock nodes of ``app`` (of ``task``, if given) are the broker's,
    for want of ``redlock_nodes`` (and of the task's ``lock_nodes``)."""
    if task is not None and getattr(task, "lock_nodes", None) is not None:
        return False
    return not app.conf.get("redlock_nodes")


def _has_lock_nodes(app: Any) -> bool:
    """Whether the broker URL can serve as the lock node (see :func:`nodes_from_app`)."""
    broker = app.conf.broker_url
    return isinstance(broker, str) and broker.split("://", 1)[0] in ("redis", "rediss", "sentinel")


def nodes_from_app(app: Any, owner: str = "app.conf") -> tuple:
    """The broker URL as the one Redlock node, when it is a Redis or a Sentinel URL.

    A Celery Sentinel broker (``sentinel://h1:26379;sentinel://h2:26379`` with
    ``master_name`` in ``broker_transport_options``) becomes the one
    ``sentinel://h1:26379,h2:26379/<master_name>`` node, with the password and
    db of its first URL, the sentinels' password from the transport options'
    ``sentinel_kwargs`` and TLS from ``broker_use_ssl``.
    """
    broker = app.conf.broker_url
    scheme = broker.split("://", 1)[0] if isinstance(broker, str) else None
    if scheme in ("redis", "rediss"):
        return (broker.split(";", 1)[0],)
    if scheme == "sentinel":
        options = app.conf.broker_transport_options or {}
        if not options.get("master_name"):
            raise ImproperlyConfigured(
                f"{owner}: the broker is a Sentinel URL but broker_transport_options has no "
                f"master_name; set it, or set {spelt(app, 'redlock_nodes')}"
            )
        return (sentinel_node(broker, options, app.conf.broker_use_ssl),)
    raise ImproperlyConfigured(
        f"{owner}: set {spelt(app, 'redlock_nodes')} (a list of lock node URLs: redis://, "
        f"rediss://, sentinel://, postgresql://, etcd://, ...); the broker "
        f"{_scheme(broker)} is not Redis, so it cannot serve as the default lock node"
    )


def _scheme(url: Any) -> str:
    return f"{url.split('://', 1)[0]}://..." if isinstance(url, str) and "://" in url else repr(url)


# One Redlock per app and node configuration, so every task sharing the nodes
# shares the connections. Weak on the app: no state is set on foreign objects.
_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_clients_lock = threading.Lock()


def redlock_for(app: Any, settings: LockSettings) -> Redlock:
    """The shared :class:`Redlock` of ``app`` for these settings' nodes and options.

    Raises:
        ImproperlyConfigured: a node is invalid (URL, duplicate).
    """
    options = settings.redlock_options()
    cache_key = (
        tuple(n if isinstance(n, str) else id(n) for n in settings.node_list),
        tuple(sorted(options.items())),
    )
    with _clients_lock:
        per_app = _clients.setdefault(app, {})
        client = per_app.get(cache_key)
        if client is None:
            with bind_errors():
                client = per_app[cache_key] = Redlock(settings.node_list, **options)
        return client


def setting(name: str) -> Setting:
    """The declaration of one setting, by its ``app.conf`` name."""
    return by_name(name)


# -- provenance: where each value comes from (for ``celery redlock settings``) ---

__all__ += ["Provenance", "provenance"]


class Provenance(NamedTuple):
    """One setting's value and where it comes from (:func:`provenance`)."""

    name: str
    value: Any
    #: ``task.lock_<x>`` (the task's attribute), ``app.conf``, ``default``, or,
    #: for a value :func:`resolve` fills in, what it is made from.
    source: str


#: What :func:`resolve` fills in a setting left None from.
_DERIVED_FROM = {
    "redlock_nodes": "broker_url",
    "redlock_heartbeat_interval": "ttl / 3",
    # None stays: each node takes its kind's own (core.default_timeouts)
    "redlock_node_timeout": "each node's kind",
    "redlock_connect_timeout": "each node's kind",
}


def provenance(
    app: Any, task: Any = None, settings: LockSettings | None = None
) -> list[Provenance]:
    """Every setting of :data:`SETTINGS`, in order, with its value and its source.

    The precedence is :func:`resolve`'s: the task's ``lock_*`` attribute, then
    ``app.conf``, then the default.

    Args:
        app: the Celery app.
        task: the task whose attributes count, or None for the app's values.
        settings: the values :func:`resolve` gave for that task (or the app);
            when given, they are the values reported, and a setting that
            resolve() filled in names what it was made from.
    """
    out = []
    for setting in SETTINGS:
        override = getattr(task, setting.task_attr, None) if task is not None else None
        if override is not None:
            value, source = override, f"task.{setting.task_attr}"
        elif app.conf.get(setting.name) is not None:
            value, source = app.conf.get(setting.name), "app.conf"
        else:
            value, source = setting.default, "default"
        field = setting.name[len("redlock_") :]
        if settings is not None and hasattr(settings, field):
            if value is None:
                source = _DERIVED_FROM.get(setting.name, "derived")
            value = getattr(settings, field)
        out.append(Provenance(setting.name, value, source))
    return out
