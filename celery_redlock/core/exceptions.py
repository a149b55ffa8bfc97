"""Every error celery_redlock raises, under one root.

::

    RedlockError
    ├── ConfigurationError        (also ValueError: a setting or argument is invalid)
    │   └── ImproperlyConfigured  (also celery.exceptions.ImproperlyConfigured; in
    │                             celery_redlock.conf: raised at bind / for app.conf)
    ├── LockKeyError              (also TypeError: an argument has no canonical form)
    ├── NodeError                 (also ConnectionError) one node's failure: ``node``,
    │                             ``heals`` (False: it cannot end without a fix)
    ├── QuorumUnavailable         fewer than a quorum of nodes answered (``heals``)
    └── LockError                 about one lock; carries ``name``
        ├── LockNotAcquired       a blocking acquire timed out
        │   └── LockContended     another holder has it (``holder``, ``remaining``)
        ├── LockLost              the lease lapsed or lost its quorum while held
        │   └── LockSuperseded    a newer call of the key asked the holder to stop
        │                         (``successor``: its task id)
        └── AlreadyEnqueued       another task is claimed to run the key next
                                  (``task_id``, ``remaining``)

``QuorumUnavailable`` is never raised for contention, and contention is never
reported as an outage: callers can tell "someone else holds it" from "the lock
service is down".

This module is core: it imports neither celery nor kombu. The one
Celery-flavoured leaf, ``ImproperlyConfigured``, lives in the Celery layer
(:mod:`celery_redlock.conf`) and is exported as
``celery_redlock.ImproperlyConfigured``: ``except ConfigurationError`` and
``except celery.exceptions.ImproperlyConfigured`` both catch it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "AlreadyEnqueued",
    "ConfigurationError",
    "LockContended",
    "LockError",
    "LockKeyError",
    "LockLost",
    "LockNotAcquired",
    "LockSuperseded",
    "NodeError",
    "QuorumUnavailable",
    "RedlockError",
    "heals",
    "named_once",
]


class RedlockError(Exception):
    """Root of every celery_redlock error."""


class ConfigurationError(RedlockError, ValueError):
    """A setting or argument is invalid; raised when the task binds or the client is built.

    The Celery layer raises its subclass ``celery_redlock.ImproperlyConfigured``.
    """


class LockKeyError(RedlockError, TypeError):
    """An argument selected for the lock key cannot be put in canonical form."""


class NodeError(RedlockError, ConnectionError):
    """One lock node failed a call, whatever its kind; each kind raises (or
    returns as the node's reply) its own subclass.

    Attributes:
        node: the node's name (its URL, password masked), or None.
        heals: True for an outage (the server may come back by itself); False
            for what cannot end without a fix: authentication refused, a
            database or schema missing (or of another version), a TLS
            certificate not verified.
    """

    def __init__(self, message: str, node: str | None = None, heals: bool = True):
        self.node = node
        self.heals = heals
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.node, self.heals))


def heals(error: BaseException | str) -> bool:
    """False for a node's error that cannot end without a fix (see :class:`NodeError`);
    a node refused as misconfigured (a :class:`ConfigurationError` as its reply) neither."""
    if isinstance(error, NodeError):
        return error.heals
    return not isinstance(error, ConfigurationError)


class QuorumUnavailable(RedlockError):
    """Fewer than a quorum of the configured nodes answered.

    Attributes:
        errors: node name -> the error it gave (or ``"timeout"``).
        quorum: how many answers were needed.
    """

    def __init__(self, errors: Mapping[str, BaseException | str], quorum: int, total: int):
        self.errors = dict(errors)
        self.quorum = quorum
        self.total = total
        super().__init__(
            f"only {total - len(self.errors)} of {total} lock nodes answered, "
            f"{quorum} needed ({self.detail()})"
        )

    def detail(self) -> str:
        """Each node's error, the node named once (``node: error; ...``)."""
        return "; ".join(named_once(node, err) for node, err in self.errors.items())

    def __reduce__(self):  # keep it picklable for Celery result backends
        return (type(self), (self.errors_as_text(), self.quorum, self.total))

    def errors_as_text(self) -> dict:
        return {node: str(err) for node, err in self.errors.items()}

    @property
    def unhealed(self) -> dict[str, BaseException | str]:
        """Node name -> error, of the nodes whose error cannot end without a fix."""
        return {node: err for node, err in self.errors.items() if not heals(err)}

    @property
    def heals(self) -> bool:
        """False when the nodes that cannot heal leave fewer than a quorum: no
        lock can be taken until they are fixed, however long one waits."""
        return self.total - len(self.unhealed) >= self.quorum


def named_once(node: str, error: object) -> str:
    """``node: error``, the node named once: a node's own errors start with its name."""
    text = str(error)
    return text if text.startswith(f"{node}: ") else f"{node}: {text}"


class LockError(RedlockError):
    """An error about one lock.

    Attributes:
        name: the lock name.
    """

    def __init__(self, message: str, name: str):
        self.name = name
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.name))


class LockNotAcquired(LockError):
    """A blocking acquire ran out of time."""

    @staticmethod
    def of(name: str, timeout: float | None, holder: Any) -> LockNotAcquired:
        """The error of a blocking acquire of ``name`` that ran out of ``timeout``, with
        the lock's ``holder`` as the quorum saw it then (:class:`.records.Holder`)."""
        if holder.owner:
            message = f"lock {name!r} is held by {holder.owner}"
            return LockContended(message, name, holder.owner, holder.remaining)
        return LockNotAcquired(f"lock {name!r} not acquired within {timeout}s", name)


class LockContended(LockNotAcquired):
    """Another holder has the lock.

    Attributes:
        holder: the holder's owner value (task id first), if known.
        remaining: seconds left on the holder's lease as the quorum sees it, if known.
    """

    def __init__(
        self,
        message: str,
        name: str,
        holder: str | None = None,
        remaining: float | None = None,
    ):
        self.holder = holder
        self.remaining = remaining
        super().__init__(message, name)

    def __reduce__(self):
        return (type(self), (str(self), self.name, self.holder, self.remaining))


class LockLost(LockError):
    """The lease is no longer held: it expired, or a renewal failed to reach a quorum."""


class LockSuperseded(LockLost):
    """A newer call of the key asked the holder to stop (``lock_on_duplicate="supersede"``).

    The lease itself is still held (renewed until the holder lets go): a body
    that catches this may finish a write before it stops.

    Attributes:
        successor: the task id of the newer call.
    """

    def __init__(self, message: str, name: str, successor: str):
        self.successor = successor
        super().__init__(message, name)


class AlreadyEnqueued(LockError):
    """Another task id holds the key's enqueue claim: it is already on its way.

    Attributes:
        task_id: the id of the task the claim names.
        remaining: seconds left on the claim, if known.
    """

    def __init__(self, message: str, name: str, task_id: str, remaining: float | None = None):
        self.task_id = task_id
        self.remaining = remaining
        super().__init__(message, name)

    def __reduce__(self):
        return (type(self), (str(self), self.name, self.task_id, self.remaining))


# Tracebacks and Celery's result backend name an exception by its module
# (``exc_module``): keep the documented path, so results stored by one version
# read back in another.
for _name in __all__:
    if isinstance(globals()[_name], type):
        globals()[_name].__module__ = "celery_redlock.exceptions"
del _name
