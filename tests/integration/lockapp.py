"""The Celery app the integration and fault tests run, and the harness that runs it.

Two halves, in one module so that the test process and the worker processes
import one and the same thing:

**The app** (imported by every worker). :func:`make_app` builds a Celery app
whose tasks are all :class:`~celery_redlock.LockedTask`; each task body records
what it saw in a *recorder* Redis list, as JSON: task id, phase, start and end
(``time.time()``, comparable across processes on one machine), the fencing
token, the pid, ``request.retries``, the lock attempt header,
``request.kwargs`` and whether the lease was lost. A worker subprocess gets the
app as ``celery -A lockapp``: the module-level ``app`` is built from
environment variables (``CRL_BROKER_URL``, ``CRL_BACKEND_URL``,
``CRL_NODES`` (comma-separated), ``CRL_RECORDER_URL``, ``CRL_PREFIX``), and
``CRL_READY_FILE`` names a file written when the worker is ready to consume.

**The harness** (used by the tests only): :class:`Topology` is the private
Redis processes of a test module (one node for broker, results and recorder in
separate DBs, three for the Redlock quorum); :class:`PreforkWorker` runs
``celery worker -P prefork`` in its own session, logs to a file, and stops it by
pid (SIGTERM, then SIGKILL) leaving no process behind; :func:`threads_worker`
runs an in-process threads worker; :class:`WorkerLogs` adds the tail of every
live worker's log to a failed test's report; and the checks on recorded runs
(:func:`assert_no_overlap`, :func:`assert_tokens_increase`).

Every app is built with ``shared=False`` tasks: Celery's default (shared)
would register each task on every app finalized later in the process.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery
from celery import signals as celery_signals
from celery.exceptions import Ignore

from celery_redlock import LockedTask, LockLost, current_lease
from celery_redlock.policies import attempt_of

if TYPE_CHECKING:  # the harness only: workers never import the pytest plugin
    from celery_redlock.testing import RedisNode, RedisNodes

HERE = os.path.dirname(os.path.abspath(__file__))

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


def assert_no_overlap(runs: Sequence[dict]) -> None:
    """Sorted by start, every execution starts after the previous one ended."""
    ordered = sorted(runs, key=lambda r: r["start"])
    for before, after in zip(ordered, ordered[1:]):
        assert after["start"] >= before["end"], (
            f"executions overlap: {before['id']} ran {before['start']:.3f}-{before['end']:.3f}, "
            f"{after['id']} started {after['start']:.3f}"
        )


def assert_tokens_increase(runs: Sequence[dict]) -> None:
    """Ordered by start, fencing tokens strictly increase."""
    tokens = [r["token"] for r in sorted(runs, key=lambda r: r["start"])]
    assert all(isinstance(t, int) for t in tokens), tokens
    assert all(a < b for a, b in zip(tokens, tokens[1:])), (
        f"tokens not strictly increasing: {tokens}"
    )


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


def _sleep_until(deadline: float) -> None:
    while True:
        left = deadline - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def make_app(
    broker: str,
    backend: str,
    nodes: Sequence[str],
    recorder: str,
    prefix: str,
    main: str = "lockapp",
    **conf: Any,
) -> Celery:
    """A Celery app with every test task, locking on ``nodes`` under ``prefix``."""
    app = Celery(main, broker=broker, backend=backend, set_as_current=False)
    app.conf.update(BASE_CONF, redlock_nodes=list(nodes), redlock_key_prefix=prefix, **conf)
    rec = Recorder(recorder)
    app.recorder = rec  # for the tests: the same recorder the bodies write to

    def body(task: Any, key: str, run: str, duration: float, token: Any, **extra: Any) -> dict:
        """Record a start, hold the lock ``duration`` seconds, record an end."""
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
            kwargs=dict(request.kwargs or {}),
            start=time.time(),
            **extra,
        )
        rec.push(run, phase="start", **fields)
        _sleep_until(fields["start"] + duration)
        fields.update(end=time.time(), lost=lease.lost, remaining=lease.remaining())
        rec.push(run, phase="end", **fields)
        return {"token": token, "pid": fields["pid"]}

    def task(**options: Any) -> Any:
        options.setdefault("bind", True)
        options.setdefault("lock_on", ("key",))
        return app.task(base=LockedTask, shared=False, **options)

    @task(name="lockapp.slow")
    def slow(self, key, run, duration=1.0, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.slow_retry", lock_on_duplicate="retry", max_retries=0)
    def slow_retry(self, key, run, duration=0.25, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

    @task(name="lockapp.shared_a", lock_name="crl-shared")
    def shared_a(self, key, run, duration=1.0, fencing_token=None):
        return body(self, key, run, duration, fencing_token)

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

    return app


def app_from_env(env: Any = os.environ, main: str = "lockapp") -> Celery:
    return make_app(
        broker=env["CRL_BROKER_URL"],
        backend=env["CRL_BACKEND_URL"],
        nodes=[n for n in env["CRL_NODES"].split(",") if n],
        recorder=env["CRL_RECORDER_URL"],
        prefix=env["CRL_PREFIX"],
        main=main,
    )


def _write_ready_file(**_: Any) -> None:
    path = os.environ["CRL_READY_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


#: What ``celery -A lockapp`` finds; None outside a worker subprocess.
app: Celery | None = app_from_env() if os.environ.get("CRL_BROKER_URL") else None
if app is not None and os.environ.get("CRL_READY_FILE"):
    celery_signals.worker_ready.connect(_write_ready_file, weak=False)


# -- the harness -----------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, session) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``T`` stopped, ``Z``...), None if gone."""
    stat = _proc_stat(pid)
    return stat[0] if stat else None


class WorkerLogs:
    """A pytest plugin: a failed test's report gets the log tail of every live prefork worker."""

    NAME = "crl-worker-logs"

    def __init__(self) -> None:
        self.live: list[PreforkWorker] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            for worker in list(self.live):
                report.sections.append(
                    (f"prefork worker {worker.name} log (tail)", worker.log_tail())
                )

    def register(self, config: Any) -> None:
        if not config.pluginmanager.has_plugin(self.NAME):
            config.pluginmanager.register(self, self.NAME)


WORKER_LOGS = WorkerLogs()


class PreforkWorker:
    """``celery -A lockapp worker -P prefork`` in a subprocess of its own session.

    Args:
        name: node name prefix and log file name.
        env: the ``CRL_*`` variables (broker, backend, nodes, recorder, prefix).
        logdir: where the log file and the readiness marker go.
        queues: queues to consume.
        concurrency: pool size.
    """

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        logdir: str,
        queues: Sequence[str] = ("celery",),
        concurrency: int = 4,
    ) -> None:
        self.name = name
        self.env = env
        self.queues = list(queues)
        self.concurrency = concurrency
        self.logfile = os.path.join(logdir, f"{name}.log")
        self.ready_file = os.path.join(logdir, f"{name}.ready")
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> PreforkWorker:
        """Launch the worker and wait until it consumes."""
        return self.launch().await_ready(timeout)

    def launch(self) -> PreforkWorker:
        """Start the process without waiting (start several, then await each)."""
        if os.path.exists(self.ready_file):
            os.unlink(self.ready_file)
        env = dict(os.environ, **self.env, CRL_READY_FILE=self.ready_file)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable, "-m", "celery", "-A", "lockapp", "worker",
            "-P", "prefork", "-c", str(self.concurrency),
            "--without-mingle", "--without-gossip", "--without-heartbeat",
            "-n", f"{self.name}@%h", "-Q", ",".join(self.queues), "--loglevel", "INFO",
        ]  # fmt: skip
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=HERE,
                env=env,
                start_new_session=True,
            )
        WORKER_LOGS.live.append(self)
        return self

    def await_ready(self, timeout: float = 60.0) -> PreforkWorker:
        """Wait for the readiness marker (written on ``worker_ready``); stop it on failure."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.ready_file):
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(
                    f"worker {self.name} exited ({self.proc.returncode}):\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"worker {self.name} not ready within {timeout}s:\n{tail}")
            time.sleep(0.05)
        return self

    def children(self) -> list[int]:
        """The pids of the pool's child processes."""
        return [pid for pid in _all_pids() if (_proc_stat(pid) or ("", 0))[1] == self.pid]

    def session_pids(self) -> list[int]:
        """Every live (non-zombie) process of the worker's session: main, children, their forks."""
        if self.proc is None:
            return []
        out = []
        for pid in _all_pids():
            stat = _proc_stat(pid)
            if stat and stat[3] == self.proc.pid and stat[0] != "Z":
                out.append(pid)
        return out

    def stop(self, term_timeout: float = 10.0) -> None:
        """SIGTERM the main process, SIGKILL it after ``term_timeout``, then any leftover, by pid.

        Raises:
            RuntimeError: a process of the worker's session is still alive afterwards.
        """
        if self.proc is None:
            return
        try:
            for pid in self.session_pids():  # a test may have left one stopped
                _signal(pid, signal.SIGCONT)
            if self.proc.poll() is None:
                _signal(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(term_timeout)
                except subprocess.TimeoutExpired:
                    _signal(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
            deadline = time.monotonic() + 5  # children exit once their parent is gone
            while self.session_pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in self.session_pids():
                _signal(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while self.session_pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            left = self.session_pids()
            if left:
                raise RuntimeError(f"worker {self.name} left processes behind: {left}")
        finally:
            if self in WORKER_LOGS.live:
                WORKER_LOGS.live.remove(self)

    def log_tail(self, lines: int = 60) -> str:
        try:
            with open(self.logfile, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 200_000))
                text = f.read().decode(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


@contextmanager
def threads_worker(app: Celery, concurrency: int = 4) -> Iterator[Any]:
    """An in-process worker with the threads pool, consuming ``app``'s default queue."""
    from celery.contrib.testing.worker import start_worker

    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        shutdown_timeout=30.0,
        loglevel="WARNING",
    ) as worker:
        yield worker


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


RECORDER_DB = 2


@dataclass
class Topology:
    """A test module's private Redis processes.

    ``hub`` serves the broker, the result backends and the recorder (separate
    DBs); ``quorum`` is the three Redlock nodes, which a test may kill without
    touching the broker.
    """

    hub: RedisNode
    quorum: RedisNodes
    prefix: str
    apps: list[Celery] = field(default_factory=list)

    def url(self, db: int) -> str:
        return f"redis://{self.hub.host}:{self.hub.port}/{db}"

    def env(self, broker_db: int, backend_db: int) -> dict[str, str]:
        """The ``CRL_*`` variables a worker subprocess builds its app from."""
        return {
            "CRL_BROKER_URL": self.url(broker_db),
            "CRL_BACKEND_URL": self.url(backend_db),
            "CRL_NODES": ",".join(self.quorum.urls),
            "CRL_RECORDER_URL": self.url(RECORDER_DB),
            "CRL_PREFIX": self.prefix,
        }

    def app(self, broker_db: int, backend_db: int, main: str = "lockapp-client") -> Celery:
        """An app on a worker's broker and backend: to send with, or to run in-process."""
        app = app_from_env(self.env(broker_db, backend_db), main=main)
        self.apps.append(app)
        return app

    def recorder(self) -> redis.Redis:
        return self.hub.client(db=RECORDER_DB)

    def lock_keys(self) -> dict[int, list[str]]:
        """Lock keys on every running quorum node (fence keys are kept by design)."""
        return self.quorum.keys(f"{self.prefix}:lock:*")

    def assert_no_lock_keys(self, timeout: float = 3.0) -> None:
        """Wait (briefly) until no quorum node holds a lock key."""
        try:
            wait_for(lambda: not any(self.lock_keys().values()), timeout, "lock keys to go")
        except AssertionError:
            raise AssertionError(f"lock keys left behind: {self.lock_keys()}") from None

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        # An AsyncResult that waited on a result unsubscribes when collected; collect
        # them while the hub is up, or each retries its reconnect for a minute at exit.
        gc.collect()
        for app in self.apps:
            app.close()
        self.quorum.close()
        self.hub.close()


def make_topology(prefix: str) -> Topology:
    from celery_redlock.testing import RedisNode, RedisNodes

    hub = RedisNode()
    try:
        quorum = RedisNodes(3)
    except BaseException:
        hub.close()
        raise
    return Topology(hub, quorum, prefix)


@dataclass
class WorkerHandle:
    """What a test needs from a worker: the app to send with, and the recorded runs."""

    kind: str  # "prefork" or "threads"
    app: Celery
    topology: Topology
    process: PreforkWorker | None = None

    def task(self, name: str) -> Any:
        return self.app.tasks[f"lockapp.{name}"]

    def records(self, run: str, phase: str | None = "end") -> list[dict]:
        with self.topology.recorder() as client:
            return read_records(client, run, phase)


def new_run() -> str:
    """A unique id for one test's records and lock keys."""
    return uuid.uuid4().hex
