"""Redlock's public surface does not move: its methods, their signatures, its
attributes, Lease's, and the names celery_redlock exports, against a list
recorded before the core was split into one module per primitive (and grown
since: the queues' park, queue_next, queue_peek and queue_keys; a lease's
supersede and superseded_by; LockSuperseded; NodeError; a lease's lost_reason)."""

from __future__ import annotations

import inspect
import re

import celery_redlock
from celery_redlock import Lease, Redlock


def signature(function) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", str(inspect.signature(function)))


def surface() -> dict:
    rl = Redlock(["redis://127.0.0.1:1"])  # no connection is made
    out: dict = {"Redlock()": signature(Redlock), "__all__": list(celery_redlock.__all__)}
    for cls, obj in ((Redlock, rl), (Lease, None)):
        methods = {
            name: signature(getattr(cls, name))
            for name in dir(cls)
            if not name.startswith("_") and inspect.isfunction(getattr(cls, name))
        }
        names = dir(obj) if obj is not None else dir(cls)
        others = sorted(n for n in names if not n.startswith("_") and n not in methods)
        out[cls.__name__] = {"methods": methods, "attributes": others}
    return out


RECORDED = {
    "Lease": {
        "attributes": [
            "also",
            "fence_key",
            "fencing_token",
            "key",
            "lost",
            "lost_reason",
            "name",
            "owner",
            "permit",
            "redlock",
            "superseded_by",
            "task_id",
            "ttl",
        ],
        "methods": {
            "check": "(self) -> 'None'",
            "mark_lost": "(self, reason: 'str | None' = None) -> 'None'",
            "remaining": "(self) -> 'float'",
            "supersede": "(self, successor: 'str') -> 'bool'",
        },
    },
    "Redlock": {
        "attributes": [
            "PERMIT_ROUNDS",
            "PERMIT_SPLIT_PAUSE",
            "clock",
            "connect_timeout",
            "drift_factor",
            "fence_retention",
            "fencing",
            "key_prefix",
            "min_replicas",
            "node_timeout",
            "nodes",
            "quorum",
            "rng",
            "sleep",
        ],
        "methods": {
            "acquire": "(self, name: 'str', *, ttl: 'float', blocking: 'bool' "
            "= False, timeout: 'float | None' = None, owner: 'str "
            "| None' = None, retry_delay: 'float' = 0.05, "
            "retry_delay_max: 'float' = 1.0, fence: 'bool' = True, "
            "limit: 'int' = 1, also: 'Sequence[tuple[str, int]]' = "
            "()) -> 'Lease | None'",
            "agreed": "(self, views: 'Iterable[NodeView]') -> 'Holder'",
            "check_quorum": "(self, replies: 'Sequence[Any]') -> 'None'",
            "claim": "(self, key: 'str', value: 'str', *, ttl: 'float') -> 'bool'",
            "claim_key": "(self, name: 'str') -> 'str'",
            "claim_next": "(self, name: 'str', claimant: 'str', *, ttl: "
            "'float', replace: 'bool' = False) -> 'Claim'",
            "claimant": "(self, name: 'str') -> 'Claim'",
            "close": "(self) -> 'None'",
            "coalesce_key": "(self, name: 'str', kind: 'str') -> 'str'",
            "debounce": "(self, name: 'str', claimant: 'str', *, delay: "
            "'float', max_delay: 'float | None', ttl: 'float') -> "
            "'Schedule'",
            "extend": "(self, lease: 'Lease', ttl: 'float | None' = None) -> 'bool'",
            "extend_many": "(self, leases: 'Sequence[Lease]', ttl: 'float | "
            "None' = None) -> 'list[bool]'",
            "force_release": "(self, name: 'str') -> 'list[Deletion]'",
            "has_quorum": "(self, answered: 'int') -> 'bool'",
            "holder": "(self, name: 'str') -> 'Holder'",
            "inspect": "(self, name: 'str') -> 'list[dict[str, Any]]'",
            "inspect_key": "(self, key: 'str', fence_key: 'str | None' = "
            "None, *, skip: 'dict[str, str] | None' = None) -> "
            "'list[NodeView]'",
            "keys": "(self, name: 'str') -> 'tuple[str, str]'",
            "lock": "(self, name: 'str', *, ttl: 'float', timeout: 'float | "
            "None' = None) -> 'Iterator[Lease]'",
            "node_info": "(self) -> 'list[NodeInfo]'",
            "park": "(self, name: 'str', id: 'str', call: 'str', *, most: 'int', "
            "retention: 'float', supersede: 'bool' = False) -> 'Parked'",
            "permit_keys": "(self, name: 'str', limit: 'int') -> 'list[str]'",
            "queue_keys": "(self, name: 'str') -> 'tuple[str, str]'",
            "queue_peek": "(self, name: 'str') -> 'QueueView'",
            "queue_next": "(self, name: 'str', *, limit: 'int' = 1, drop: 'str' = '', "
            "owner: 'str' = '', claim_ttl: 'float | None' = None, retention: 'float' = "
            "1.0) -> 'HandOver'",
            "rate": "(self, name: 'str', rate: 'Any', *, burst: 'int' = 1, also: "
            "'Mapping[str, Any] | Iterable[tuple[str, Any]] | None' = None, now: "
            "'float | None' = None) -> 'RateSlot'",
            "read_claim": "(self, key: 'str') -> 'ClaimView'",
            "receipt_key": "(self, name: 'str', id: 'str') -> 'str'",
            "release": "(self, lease: 'Lease', *, receipt: 'float | None' = "
            "None, withdraw_claim: 'bool' = False, wait: 'bool' = True) -> 'None'",
            "release_owned_by": "(self, name: 'str', task_id: 'str', limit: 'int' = 1) -> 'int'",
            "scan": "(self, kind: 'str' = 'lock', pattern: 'str' = '*', *, "
            "limit: 'int' = 100, count: 'int' = 1000) -> 'ScanResult'",
            "throttle": "(self, name: 'str', claimant: 'str', *, period: "
            "'float', trailing: 'bool', ttl: 'float') -> "
            "'Schedule'",
            "try_acquire": "(self, name: 'str', *, ttl: 'float', owner: 'str "
            "| None' = None, fence: 'bool' = True, task_id: "
            "'str | None' = None, receipts: 'bool' = False, "
            "claim: 'str | None' = None, own_claim: 'bool' = "
            "False, throttle: 'float | None' = None, slot: "
            "'str | None' = None, limit: 'int' = 1, also: "
            "'Sequence[tuple[str, int]]' = (), rates: "
            "'Sequence[RateKey]' = (), booked: 'bool' = False) -> 'Lease | "
            "Holder | Claim | Finished | TooEarly | RateSlot'",
            "withdraw_claim": "(self, name: 'str', claimant: 'str') -> 'int'",
        },
    },
    "Redlock()": "(nodes: 'Sequence[NodeSpec]', *, node_timeout: 'float | None' = None, "
    "connect_timeout: 'float | None' = None, "
    "drift_factor: 'float' = 0.01, key_prefix: 'str' = 'redlock', fencing: "
    "'bool' = True, fence_retention: 'float' = 604800.0, min_replicas: 'int' = "
    "0, clock: 'Callable[[], float]' = <built-in function monotonic>, sleep: "
    "'Callable[[float], None]' = <built-in function sleep>, rng: 'Callable[[], "
    "float]' = <built-in method random of Random object>)",
    "__all__": [
        "AlreadyEnqueued",
        "AsyncRedlock",
        "Claim",
        "ConfigurationError",
        "Finished",
        "Holder",
        "ImproperlyConfigured",
        "Lease",
        "LockContended",
        "LockError",
        "LockKeyError",
        "LockLost",
        "LockNotAcquired",
        "LockPlan",
        "LockSuperseded",
        "LockedTask",
        "NodeError",
        "QuorumUnavailable",
        "RateSlot",
        "Redlock",
        "RedlockError",
        "current_lease",
        "key_of",
        "plan_of",
        "result_of",
        "superseded_by",
    ],
}


def test_the_public_surface_is_the_recorded_one():
    assert surface() == RECORDED


def test_the_facade_attributes_are_one_value_with_the_parts():
    """An attribute set on the facade (tests swap ``rng`` and ``sleep``) is the parts' own."""
    rl = Redlock(["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"])
    draws = iter([0.25])
    rl.rng = lambda: next(draws)
    assert rl.rng() == 0.25
    assert rl.quorum == 2 and rl.has_quorum(2) and not rl.has_quorum(1)
    assert rl.keys("a") == ("redlock:lock:{a}", "redlock:fence:{a}")


def test_the_async_client_takes_the_sync_clients_arguments():
    from celery_redlock import AsyncRedlock

    def shape(function) -> list:
        parameters = inspect.signature(function).parameters.values()
        return [(p.name, p.kind, p.default) for p in parameters]

    for name in ("try_acquire", "acquire", "release", "extend", "extend_many"):
        method = getattr(AsyncRedlock, name)
        assert inspect.iscoroutinefunction(method), name
        assert shape(method) == shape(getattr(Redlock, name)), name
    sync = shape(Redlock.lock)
    assert shape(AsyncRedlock.lock)[: len(sync)] == sync
