"""The Celery app of the integration and fault tests (imported by every worker).

:func:`make_app` builds a Celery app and :func:`add_tasks` gives it every test
task, all :class:`~celery_redlock.LockedTask`; each task body records what it
saw in a *recorder* Redis list, as JSON: task id, phase, start and end
(``time.time()``, comparable across processes on one machine), the fencing
token, the pid, ``request.retries``, the lock attempt header,
``request.kwargs`` and whether the lease was lost.

A worker subprocess gets the app as ``celery -A tests.support.lockapp`` (the
harness runs it from the repository root): the module-level ``app`` is built
from environment variables (``CRL_BROKER_URL``, ``CRL_BACKEND_URL``,
``CRL_NODES`` (comma-separated), ``CRL_RECORDER_URL``, ``CRL_PREFIX``), and
``CRL_READY_FILE`` names a file written when the worker is ready to consume.

The process harness that runs it is :mod:`tests.support.harness`.

Every app is built with ``shared=False`` tasks: Celery's default (shared)
would register each task on every app finalized later in the process.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis
from celery import Celery
from celery import signals as celery_signals
from celery.exceptions import Ignore

from celery_redlock import LockedTask, LockLost, current_lease, rates
from celery_redlock.core.quorum import DRIFT_FLOOR
from celery_redlock.headers import RATE_AT, attempt_of, header
from celery_redlock.plan import plan_of
from tests.support.queue_tasks import add_queue_tasks

# -- the fenced resource ---------------------------------------------------------

#: KEYS[1] value, KEYS[2] its fence; ARGV[1] token (decimal string), ARGV[2] new value.
#: Accepts the write only if the token is larger than the one stored (digit-wise
#: comparison: no Lua arithmetic on tokens). Returns 1 if written, 0 if rejected.
FENCED_WRITE = """
local f = redis.call('GET', KEYS[2])
if f and (#f > #ARGV[1] or (#f == #ARGV[1] and f >= ARGV[1])) then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


#: A fenced read-modify-write: every access presents the token and the resource
#: keeps the largest it saw, so a holder whose lease lapsed is turned away at its
#: next access once a later holder touched the resource.
#: KEYS[1] value (an integer), KEYS[2] fence; ARGV[1] token. Returns the value, or
#: false if the token is older than the fence.
FENCED_READ = """
local f = redis.call('GET', KEYS[2])
if f and (#f > #ARGV[1] or (#f == #ARGV[1] and f > ARGV[1])) then return false end
redis.call('SET', KEYS[2], ARGV[1])
return tonumber(redis.call('GET', KEYS[1]) or '0')
"""

#: KEYS as FENCED_READ; ARGV[1] token, ARGV[2] the new value: written only if no
#: later token touched the resource since. Returns 1 if written, 0 if rejected.
FENCED_UPDATE = """
local f = redis.call('GET', KEYS[2])
if f and (#f > #ARGV[1] or (#f == #ARGV[1] and f > ARGV[1])) then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


def fenced_increment(client: redis.Redis, resource: str, token: int, pause: float) -> int | None:
    """Read the counter, wait ``pause`` seconds, write it plus one, both fenced
    by ``token``. Returns the value read, or None if either access was rejected."""
    keys = (f"{resource}:value", f"{resource}:fence")
    value = client.eval(FENCED_READ, 2, *keys, str(token))
    if value is None:
        return None
    time.sleep(pause)
    if not client.eval(FENCED_UPDATE, 2, *keys, str(token), str(int(value) + 1)):
        return None
    return int(value)


def fenced_write(client: redis.Redis, resource: str, token: int, value: str) -> bool:
    """Write ``value`` to the fenced resource if ``token`` beats the stored one."""
    return bool(
        client.eval(FENCED_WRITE, 2, f"{resource}:value", f"{resource}:fence", str(token), value)
    )


# -- recording -------------------------------------------------------------------


def records_key(run: str) -> str:
    return f"crl:rec:{run}"


class Recorder:
    """Pushes JSON records to ``crl:rec:{run}`` on the recorder Redis (one client per process)."""

    def __init__(self, url: str):
        self.url = url
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> redis.Redis:
        # redis-py's pool notices a fork (pid check), so one client per app is fine.
        with self._lock:
            if self._client is None:
                self._client = redis.Redis.from_url(
                    self.url, decode_responses=True, socket_timeout=5, socket_connect_timeout=5
                )
            return self._client

    def push(self, run: str, **fields: Any) -> None:
        self.client.rpush(records_key(run), json.dumps(fields, sort_keys=True))


def read_records(client: redis.Redis, run: str, phase: str | None = None) -> list[dict]:
    """The records of ``run``, in push order (``phase``: only "start" or "end" ones)."""
    out = [json.loads(item) for item in client.lrange(records_key(run), 0, -1)]
    return [r for r in out if phase is None or r.get("phase") == phase]


# -- the app ---------------------------------------------------------------------

#: Fast settings for tests; a task overrides them with lock_* attributes.
BASE_CONF: dict[str, Any] = dict(
    redlock_ttl=2.0,
    redlock_retry_backoff=0.05,
    redlock_retry_backoff_max=0.5,
    redlock_retry_max_attempts=100_000,
    broker_transport_options={"visibility_timeout": 3600},
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=3600,
    task_acks_late=False,
)


def _sleep_until(deadline: float, until: Any = None) -> None:
    """Sleep until ``deadline`` (epoch seconds), or until ``until()`` is true."""
    while True:
        left = deadline - time.time()
        if left <= 0 or (until is not None and until()):
            return
        time.sleep(min(left, 0.05))


def booked_at(request: Any) -> float | None:
    """The instant a rated delivery was booked for (epoch seconds; None: not re-published
    for a booking, it started on its first delivery or booked at once)."""
    value = header(request, RATE_AT)
    return int(value.split(":")[0]) / 1000.0 if isinstance(value, str) else None


def eta_of(request: Any) -> float | None:
    """The message's ETA (epoch seconds; None: due on delivery): for a coalesced call,
    the due time its schedule computed (a countdown becomes an ETA when sent)."""
    eta = request.eta
    if isinstance(eta, datetime):
        return eta.timestamp()
    return datetime.fromisoformat(eta).timestamp() if eta else None


#: Per thread, when the running task's rated start last checked its booking's grace.
_grace_checks = threading.local()


def _observe_grace_checks() -> None:
    """Note, per thread, when a rated start checks its booking's grace (the product's
    check, called through unchanged). The rates page's d runs from that check to the
    body; a loaded host can deschedule the start between the check and its lock
    round, which the round's own age (:func:`round_age`) does not see."""
    check = rates._in_grace
    if getattr(check, "observed", False):
        return

    def in_grace(instant: float, keys: Any) -> bool:
        _grace_checks.at = time.time()
        return check(instant, keys)

    in_grace.observed = True  # type: ignore[attr-defined]
    rates._in_grace = in_grace


def _forget_grace_check(**_: Any) -> None:
    _grace_checks.at = None


def round_age(task: Any, lease: Any) -> float:
    """Seconds since the round that granted ``lease`` began: its TTL less the validity
    left and the drift allowance (a lease is valid for that much less than its TTL
    from the start of its round). Read at a body's start, it is the rates page's d:
    the lock's round between the rate's grace check and the body."""
    drift = plan_of(task).redlock.drift_factor
    return lease.ttl - lease.remaining() - (lease.ttl * drift + DRIFT_FLOOR)


def make_app(
    broker: str,
    backend: str,
    nodes: str | Sequence[str],
    recorder: str,
    prefix: str,
    main: str = "lockapp",
    min_ttl: float = 0.0,
    **conf: Any,
) -> Celery:
    """A Celery app with every test task, locking on ``nodes`` under ``prefix``;
    ``min_ttl``: the nodes' floor under a lock's TTL (see :func:`add_tasks`)."""
    app = Celery(main, broker=broker, backend=backend, set_as_current=False)
    app.conf.update(app_conf(nodes, prefix, **conf))
    return add_tasks(app, recorder, min_ttl)


def app_conf(nodes: str | Sequence[str], prefix: str, **conf: Any) -> dict[str, Any]:
    """The settings of a test app: :data:`BASE_CONF`, the quorum nodes and the key prefix.

    No nodes: no ``redlock_nodes``, so the broker is the one lock node. A
    string is given to the setting as it is (its own parser splits it: the
    commas inside a ``redis+cluster://`` URL do not separate nodes).
    """
    where = {"redlock_nodes": nodes if isinstance(nodes, str) else list(nodes)} if nodes else {}
    return dict(BASE_CONF, **where, redlock_key_prefix=prefix, **conf)


def add_tasks(app: Celery, recorder: str, min_ttl: float = 0.0) -> Celery:
    """Give ``app`` every test task, recording to the Redis at URL ``recorder``.

    Lock nodes with a floor under a lock's TTL (etcd: 2 s), given as ``min_ttl``,
    have the tasks' shorter TTLs raised to it (the bind check refuses them).
    """
    rec = Recorder(recorder)
    app.recorder = rec  # for the tests: the same recorder the bodies write to

    def note_rate_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any):
        """A rated call re-published by its rate, recorded under ``{run}:retries`` with
        the booking its delivery carried (a booking given up, when it carried one)."""
        message = str(getattr(reason, "message", None) or reason)
        run = (getattr(request, "kwargs", None) or {}).get("run")
        if getattr(sender, "app", None) is app and run and message.startswith("rate:"):
            rec.push(f"{run}:retries", reason=message, booked=booked_at(request), at=time.time())

    celery_signals.task_retry.connect(note_rate_retry, weak=False)
    _observe_grace_checks()
    celery_signals.task_prerun.connect(_forget_grace_check, weak=False)

    def body(
        task: Any,
        key: str,
        run: str,
        duration: float,
        token: Any,
        go_key: str | None = None,
        **extra: Any,
    ) -> dict:
        """Record a start, hold the lock ``duration`` seconds (or until ``go_key`` exists
        on the recorder, if given), record an end."""
        request = task.request
        lease = request.redlock
        fields = dict(
            task=task.name,
            id=request.id,
            key=key,
            pid=os.getpid(),
            token=token,
            lease_token=lease.fencing_token,
            lease_key=lease.key,
            retries=request.retries,
            attempt=attempt_of(request),
            booked=booked_at(request),
            eta=eta_of(request),
            kwargs=dict(request.kwargs or {}),
            start=time.time(),
            round=round_age(task, lease),
            checked=getattr(_grace_checks, "at", None),
            **extra,
        )
        rec.push(run, phase="start", **fields)
        go = (lambda: rec.client.exists(go_key)) if go_key else None
        _sleep_until(fields["start"] + duration, go)
        fields.update(
            end=time.time(), lost=lease.lost, lost_reason=lease.lost_reason,
            remaining=lease.remaining(),
        )  # fmt: skip
        rec.push(run, phase="end", **fields)
        return {"token": token, "pid": fields["pid"]}

    def task(**options: Any) -> Any:
        options.setdefault("bind", True)
        options.setdefault("lock_on", ("key",))
        if min_ttl:
            options["lock_ttl"] = max(options.get("lock_ttl", BASE_CONF["redlock_ttl"]), min_ttl)
        return app.task(base=LockedTask, shared=False, **options)

    @task(name="lockapp.slow")
    def slow(self, key, run, duration=1.0, fencing_token=None, go_key=None):
        return body(self, key, run, duration, fencing_token, go_key)

    @task(name="lockapp.async_slow", lock_on_duplicate="drop", lock_ttl=1.2)
    async def async_slow(self, key, run, duration=1.0, fencing_token=None):
        """An async def body: it runs inside its lease, on the worker process's loop."""
        lease = self.request.redlock
        start = time.time()
        rec.push(run, phase="start", id=self.request.id, token=fencing_token,
                 lease_token=lease.fencing_token, name=lease.name, start=start)  # fmt: skip
        await asyncio.sleep(duration)
        rec.push(run, phase="end", id=self.request.id, token=fencing_token, name=lease.name,
                 start=start, end=time.time(), lost=lease.lost)  # fmt: skip
        return {"token": fencing_token}

    @task(name="lockapp.by_order", lock_on={"order_id": int})
    def by_order(self, order_id, run, duration=1.0, fencing_token=None):
        """Locked per order, whatever type the order id comes in."""
        return body(self, str(order_id), run, duration, fencing_token)

    @task(name="lockapp.held_until_lost")
    def held_until_lost(self, key, run, duration=60.0, fencing_token=None):
        """Hold the lock until the heartbeat finds the lease lost (released from
        outside, say) or ``duration`` passes; return whether it was lost."""
        lease = self.request.redlock
        _sleep_until(time.time() + duration, lambda: lease.lost)
        return {"lost": lease.lost}

    @task(name="lockapp.slow_retry", lock_on_duplicate="retry", max_retries=0)
    def slow_retry(self, key, run, duration=0.25, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.slow_raise", lock_on_duplicate="raise")
    def slow_raise(self, key, run, duration=1.0, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    # Its duplicates must wait in place: a node stalled past the 50 ms default on a
    # busy host would be an outage, which re-publishes by design.
    @task(
        name="lockapp.slow_wait",
        lock_on_duplicate="wait",
        lock_wait_timeout=30.0,
        lock_node_timeout=0.5,
    )
    def slow_wait(self, key, run, duration=0.3, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.shared_a", lock_name="crl-shared")
    def shared_a(self, key, run, duration=1.0, fencing_token=None, go_key=None):
        return body(self, key, run, duration, fencing_token, go_key)

    @task(name="lockapp.shared_b", lock_name="crl-shared")
    def shared_b(self, key, run, duration=0.1, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.heartbeat_long", lock_ttl=1.2)
    def heartbeat_long(self, key, run, duration=3.6, fencing_token=None):
        return body(self, key, run, duration, fencing_token, ttl=self.request.redlock.ttl)

    @task(name="lockapp.crash_victim", lock_ttl=20.0, lock_on_duplicate="retry")
    def crash_victim(self, key, run, duration=0.1, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.fenced_hold", lock_ttl=1.5, lock_on_duplicate="retry")
    def fenced_hold(self, key, run, resource, go_key=None, max_wait=30.0, fencing_token=None):
        """Hold the lock until ``go_key`` exists, then check the lease and write via the fence."""
        request = self.request
        lease = request.redlock
        start = time.time()
        rec.push(
            run, phase="start", id=request.id, pid=os.getpid(), token=fencing_token, start=start
        )
        if go_key:
            while not rec.client.exists(go_key) and time.time() - start < max_wait:
                time.sleep(0.02)
        lost = lease.lost
        try:
            lease.check()
        except LockLost:
            check_raised = True
        else:
            check_raised = False
        accepted = fenced_write(rec.client, resource, fencing_token, request.id)
        rec.push(
            run,
            phase="end",
            id=request.id,
            pid=os.getpid(),
            token=fencing_token,
            start=start,
            end=time.time(),
            lost=lost,
            check_raised=check_raised,
            accepted=accepted,
        )
        return {"accepted": accepted, "lost": lost}

    def increment(task: Any, key: str, run: str, resource: str, pause: float, token: Any) -> dict:
        """The fenced read-modify-write of the network-fault run; a rejected
        access retries (a new token next time), so each task adds one, once."""
        request = task.request
        start = time.time()
        lock_phase = start - _PRERUN.pop(request.id, start)
        read = fenced_increment(rec.client, resource, token, pause)
        rec.push(
            run,
            phase="end",
            id=request.id,
            task=task.name,
            key=key,
            pid=os.getpid(),
            token=token,
            read=read,
            accepted=read is not None,
            lost=request.redlock.lost,
            retries=request.retries,
            start=start,
            end=time.time(),
            lock_phase=lock_phase,
        )
        if read is None:
            raise task.retry(countdown=0.05)
        return {"read": read, "token": token}

    @task(
        name="lockapp.fenced_rmw",
        lock_name="crl-rmw",
        max_retries=20,
        lock_on_duplicate="retry",
        lock_retry_backoff=0.02,
        lock_retry_backoff_max=0.2,
    )
    def fenced_rmw(self, key, run, resource, pause=0.02, fencing_token=None):
        return increment(self, key, run, resource, pause, fencing_token)

    @task(name="lockapp.fenced_rmw_drop", lock_name="crl-rmw", max_retries=20)
    def fenced_rmw_drop(self, key, run, resource, pause=0.02, fencing_token=None):
        return increment(self, key, run, resource, pause, fencing_token)

    @task(name="lockapp.outage_probe")
    def outage_probe(self, key, run, duration=0.05, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.user_retry", max_retries=1)
    def user_retry(self, key, run, fencing_token=None):
        body(self, key, run, 0.0, fencing_token)
        if self.request.retries == 0:
            raise self.retry(countdown=0.1)
        return "retried once"

    @task(name="lockapp.boom")
    def boom(self, key, run, fencing_token=None):
        body(self, key, run, 0.0, fencing_token)
        raise ValueError("boom")

    @task(name="lockapp.user_ignore")
    def user_ignore(self, key, run, fencing_token=None):
        body(self, key, run, 0.0, fencing_token)
        raise Ignore()

    @task(name="lockapp.soft_limited", soft_time_limit=0.5)
    def soft_limited(self, key, run, fencing_token=None):
        body(self, key, run, 5.0, fencing_token)  # interrupted by the soft limit
        return "not interrupted"

    # -- enqueue claims (test_enqueue.py) --

    @task(name="lockapp.once_finished", lock_enqueue="until_finished")
    def once_finished(self, key, run, duration=1.0, note=None, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    @task(name="lockapp.once_started", lock_enqueue="until_started")
    def once_started(self, key, run, duration=1.0, note=None, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    @task(name="lockapp.once_raise", lock_enqueue="until_finished", lock_on_enqueued="raise")
    def once_raise(self, key, run, duration=1.0, note=None, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    # a 5 s holder whose heartbeat a loaded host starved past a 2 s TTL lost its lease
    # (and the next call ran beside it): the test is of replacement, not of renewal
    @task(
        name="lockapp.once_replace",
        lock_enqueue="until_started",
        lock_on_enqueued="replace",
        lock_ttl=10.0,
    )
    def once_replace(self, key, run, duration=1.0, note=None, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    @task(name="lockapp.once_short", lock_enqueue="until_finished", lock_enqueue_ttl=2.0)
    def once_short(self, key, run, duration=0.1, note=None, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    @task(name="lockapp.once_retry", lock_enqueue="until_finished", max_retries=1)
    def once_retry(self, key, run, fencing_token=None):
        body(self, key, run, 0.0, fencing_token)
        if self.request.retries == 0:
            raise self.retry(countdown=2.0)
        return "retried"

    @task(
        name="lockapp.once_outage",
        lock_enqueue="until_finished",
        lock_on_duplicate="retry",
        lock_retry_backoff=0.2,
        lock_retry_backoff_max=1.0,
    )
    def once_outage(self, key, run, duration=0.1, note=None, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    # -- giving up (test_locked_task.py): both share one key, two quick retries --

    @task(
        name="lockapp.retry_brief",
        lock_name="crl-give-up",
        lock_on_duplicate="retry",
        lock_retry_max_attempts=2,
    )
    def retry_brief(self, key, run, duration=0.05, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(
        name="lockapp.retry_brief_drop",
        lock_name="crl-give-up",
        lock_on_duplicate="retry",
        lock_retry_max_attempts=2,
        lock_on_exhausted="drop",
    )
    def retry_brief_drop(self, key, run, duration=0.05, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.slow_idempotent", lock_idempotent_ids=True)
    def slow_idempotent(self, key, run, duration=1.0, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.collect", lock_on=("run",))
    def collect(self, results, run, fencing_token=None):
        """A chord body: records the header's results."""
        rec.push(run, phase="collect", id=self.request.id, results=results, token=fencing_token)
        return sorted(r["token"] for r in results)

    # -- debounce and throttle (test_coalesce.py) --

    @task(name="lockapp.debounced", lock_debounce=1.0, lock_on_duplicate="retry")
    def debounced(self, key, run, note=None, duration=0.05, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    @task(
        name="lockapp.debounced_capped",
        lock_debounce=1.0,
        lock_debounce_max=2.0,
        lock_on_duplicate="retry",
    )
    def debounced_capped(self, key, run, note=None, duration=0.05, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    @task(name="lockapp.throttled", lock_throttle=1.0, lock_on_duplicate="retry")
    def throttled(self, key, run, note=None, duration=0.05, fencing_token=None):
        return body(self, key, run, duration, fencing_token, note=note)

    # -- permits: lock_limit and named limits (test_permits_live.py, test_task_faults.py) --

    #: Contention retried quickly: a freed permit is taken again within ~0.2 s.
    retry_fast = dict(
        lock_on_duplicate="retry", lock_retry_backoff=0.02, lock_retry_backoff_max=0.2
    )

    @task(name="lockapp.permit3", lock_limit=3, **retry_fast)
    def permit3(self, key, run, duration=1.0, fencing_token=None):
        return body(self, key, run, duration, fencing_token, permit=self.request.redlock.permit)

    @task(name="lockapp.permit3_crash", lock_limit=3, lock_ttl=20.0, lock_on_duplicate="retry")
    def permit3_crash(self, key, run, duration=0.1, fencing_token=None):
        return body(self, key, run, duration, fencing_token, permit=self.request.redlock.permit)

    @task(name="lockapp.permit2_fenced", lock_limit=2, lock_ttl=1.5, lock_on_duplicate="retry")
    def permit2_fenced(self, key, run, resource, go_key=None, fencing_token=None):
        # fenced_hold's body, run as this task (the bound run's function takes it as self)
        return fenced_hold.run.__func__(
            self, key, run, resource, go_key=go_key, fencing_token=fencing_token
        )

    for letter in "abc":  # a named limit of 2 shared by three tasks

        @task(
            name=f"lockapp.named_{letter}",
            lock_name="crl-named",
            lock_on=(),
            lock_limit=2,
            **retry_fast,
        )
        def named(self, key, run, duration=0.3, fencing_token=None):
            return body(self, key, run, duration, fencing_token)

    # a per-key lock held together with the named limit "crl-api" (2), which
    # api_only takes on its own

    # lock_also is refused at bind on Redis Cluster nodes (test_cluster_worker.py)
    clusters = "+cluster://" in str(app.conf.get("redlock_nodes"))

    if not clusters:

        @task(name="lockapp.key_and_api", lock_also={"crl-api": 2}, **retry_fast)
        def key_and_api(self, key, run, duration=0.05, fencing_token=None):
            also = self.request.redlock.also
            return body(self, key, run, duration, fencing_token, api_key=also[0].key)

    @task(
        name="lockapp.api_only",
        lock_name="crl-api",
        lock_on=(),
        lock_limit=2,
        **retry_fast,
    )
    def api_only(self, key, run, duration=0.05, fencing_token=None):
        return body(self, key, run, duration, fencing_token, api_key=self.request.redlock.key)

    # -- rate limits (test_rates_live.py) --

    @task(name="lockapp.rated", lock_rate="10/s", **retry_fast)
    def rated(self, key, run, duration=0.01, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    def rate_of(key, run, rate="10/s", duration=0.01):
        return rate

    @task(name="lockapp.rated_at", lock_rate=rate_of, **retry_fast)
    def rated_at(self, key, run, rate="10/s", duration=0.01, fencing_token=None):
        """A rated start at the rate its call names (a rate or several)."""
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.rated_two", lock_rate=("5/s", "20/10s"), **retry_fast)
    def rated_two(self, key, run, duration=0.01, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.rated5", lock_rate="5/s", **retry_fast)
    def rated5(self, key, run, duration=0.01, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    for letter in "" if clusters else "ab":  # the shared rate "crl-rate" (10/s), a lock each

        @task(name=f"lockapp.rate_also_{letter}", lock_also={"crl-rate": "10/s"}, **retry_fast)
        def rate_also(self, key, run, duration=0.01, fencing_token=None):
            return body(self, key, run, duration, fencing_token)

    # the same shared rate taken by its lock name (lock_on=(), 8 permits: no exclusion)
    @task(
        name="lockapp.rate_named",
        lock_name="crl-rate",
        lock_on=(),
        lock_rate="10/s",
        lock_limit=8,
        **retry_fast,
    )
    def rate_named(self, key, run, duration=0.01, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.unbound_probe", bind=False)
    def unbound_probe(key, run, fencing_token=None):
        lease = current_lease()
        rec.push(
            run,
            phase="end",
            key=key,
            token=fencing_token,
            lease_token=lease.fencing_token,
            lease_key=lease.key,
            lost=lease.lost,
            pid=os.getpid(),
        )
        return lease.fencing_token

    add_queue_tasks(app, rec, body, clusters)
    return app


def app_from_env(env: Any = os.environ, main: str = "lockapp") -> Celery:
    """The app a worker subprocess runs; ``CRL_CONF`` (JSON) overrides settings."""
    return make_app(
        broker=env["CRL_BROKER_URL"],
        backend=env["CRL_BACKEND_URL"],
        nodes=env["CRL_NODES"],
        recorder=env["CRL_RECORDER_URL"],
        prefix=env["CRL_PREFIX"],
        main=main,
        min_ttl=float(env.get("CRL_MIN_TTL") or 0),
        **(
            {"redlock_node_timeout": float(env["CRL_NODE_TIMEOUT"])}
            if env.get("CRL_NODE_TIMEOUT")
            else {}
        ),
        **json.loads(env.get("CRL_CONF") or "{}"),
    )


#: task id -> time.time() at task_prerun, which Celery sends just before the
#: task is called (and the lock taken): the length of a task's lock phase.
_PRERUN: dict[str, float] = {}


def _note_prerun(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        _PRERUN[task_id] = time.time()


celery_signals.task_prerun.connect(_note_prerun, weak=False)


def _write_ready_file(**_: Any) -> None:
    path = os.environ["CRL_READY_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


#: What ``celery -A tests.support.lockapp`` finds; None outside a worker subprocess.
app: Celery | None = app_from_env() if os.environ.get("CRL_BROKER_URL") else None
if app is not None and os.environ.get("CRL_READY_FILE"):
    celery_signals.worker_ready.connect(_write_ready_file, weak=False)
    # SIGUSR2: every thread's stack to the worker's log, in the main process and
    # in each pool child (inherited at fork), for a shutdown that hangs
    faulthandler.register(signal.SIGUSR2, all_threads=True)
