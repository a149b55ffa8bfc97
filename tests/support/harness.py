"""The harness that runs the test app (:mod:`tests.support.lockapp`); tests only.

:class:`Topology` is the private Redis processes of a test module (one node for
broker, results and recorder in separate DBs, three for the Redlock quorum);
:class:`PreforkWorker` runs ``celery -A tests.support.lockapp worker -P
prefork`` in its own session, from the repository root, logs to a file, and
stops it by pid (SIGTERM, then SIGKILL) leaving no process behind;
:class:`WorkerLogs` adds the tail of every live worker's log to a failed
test's report; and the checks on recorded runs (:func:`assert_no_overlap`,
:func:`assert_tokens_increase`).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery
from kombu import Connection, Exchange, Queue

from celery_redlock.testing import RedisClusters, RedisNode, RedisNodes
from tests.support.lockapp import app_from_env, read_records
from tests.support.polling import wait_for  # noqa: F401 - the tests import it from here

#: The repository root: a worker subprocess runs there, with it on PYTHONPATH.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: What ``celery -A`` loads in a worker subprocess.
APP_MODULE = "tests.support.lockapp"


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
    """``celery -A tests.support.lockapp worker -P prefork`` in a subprocess of its own session.

    Args:
        name: node name prefix and log file name.
        env: the ``CRL_*`` variables (broker, backend, nodes, recorder, prefix).
        logdir: where the log file and the readiness marker go.
        queues: queues to consume.
        concurrency: pool size.
        app: the module ``celery -A`` names.
    """

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        logdir: str,
        queues: Sequence[str] = ("celery",),
        concurrency: int = 4,
        app: str = APP_MODULE,
    ) -> None:
        self.name = name
        self.app = app
        # A node name of its own: two test sessions sharing one RabbitMQ must not
        # claim the same exclusive pidbox queue.
        self.node = f"{name}-{uuid.uuid4().hex[:8]}"
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

    @property
    def hostname(self) -> str:
        """The worker's node name: a control command sent to it alone names it, since
        a broadcast reaches every worker on the broker (another session's too)."""
        return f"{self.node}@{socket.gethostname()}"

    def start(self, timeout: float = 60.0) -> PreforkWorker:
        """Launch the worker and wait until it consumes."""
        return self.launch().await_ready(timeout)

    def launch(self) -> PreforkWorker:
        """Start the process without waiting (start several, then await each)."""
        if os.path.exists(self.ready_file):
            os.unlink(self.ready_file)
        env = dict(os.environ, **self.env, CRL_READY_FILE=self.ready_file)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable, "-m", "celery", "-A", self.app, "worker",
            "-P", "prefork", "-c", str(self.concurrency),
            "--without-mingle", "--without-gossip", "--without-heartbeat",
            "-n", f"{self.node}@%h", "-Q", ",".join(self.queues), "--loglevel", "INFO",
        ]  # fmt: skip
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
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

    def stop(self, term_timeout: float = 10.0, *, now: bool = False) -> None:
        """SIGTERM the main process, SIGKILL it after ``term_timeout``, then any leftover, by pid.

        ``now``: SIGKILL at once, for a fixture's teardown that tests nothing of a
        warm shutdown (which waits for the tasks still running).

        Raises:
            RuntimeError: a process of the worker's session is still alive afterwards.
        """
        if self.proc is None:
            return
        try:
            for pid in self.session_pids():  # a test may have left one stopped
                _signal(pid, signal.SIGKILL if now else signal.SIGCONT)
            if now:
                self.proc.wait(10)
            elif self.proc.poll() is None:
                _signal(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(term_timeout)
                except subprocess.TimeoutExpired:  # shown with a failing test's output
                    print(f"{self.name}: no warm shutdown in {term_timeout:g}s, SIGKILL")
                    for pid in self.session_pids():  # their stacks to the log (lockapp)
                        _signal(pid, signal.SIGUSR2)
                    time.sleep(1.0)
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


def delete_amqp_queue(url: str, name: str) -> None:
    """Delete a queue and its exchange of the same name (Celery's default for a
    ``task_default_queue``) from the AMQP broker at ``url``."""
    with Connection(url, connect_timeout=3) as conn:
        channel = conn.channel()
        Queue(name, Exchange(name), routing_key=name, channel=channel).delete()
        Exchange(name, channel=channel).delete()


RECORDER_DB = 2


@dataclass
class Topology:
    """A test module's private Redis processes.

    ``hub`` serves the broker, the result backends and the recorder (separate
    DBs); ``quorum`` is the three Redlock nodes, which a test may kill without
    touching the broker.
    """

    hub: RedisNode
    quorum: RedisNodes | RedisClusters
    prefix: str
    apps: list[Celery] = field(default_factory=list)
    #: The apps' ``redlock_node_timeout``, where the default (50 ms) is not it.
    node_timeout: float | None = None
    #: The lock nodes' floor under a lock's TTL (etcd's 2 s), where there is one.
    min_ttl: float | None = None

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
            **({"CRL_NODE_TIMEOUT": str(self.node_timeout)} if self.node_timeout else {}),
            **({"CRL_MIN_TTL": str(self.min_ttl)} if self.min_ttl else {}),
        }

    def app(self, broker_db: int, backend_db: int, main: str = "lockapp-client") -> Celery:
        """An app on a worker's broker and backend: to send with, or to run in-process."""
        app = app_from_env(self.env(broker_db, backend_db), main=main)
        self.apps.append(app)
        return app

    def recorder(self) -> redis.Redis:
        return self.hub.client(db=RECORDER_DB)

    def lock_keys(self) -> dict[int, list[str]]:
        """Lock and permit keys on every running quorum node (fence keys are kept by design)."""
        found = self.quorum.keys(f"{self.prefix}:lock:*")
        for node, keys in self.quorum.keys(f"{self.prefix}:permit:*").items():
            found[node] = found.get(node, []) + keys
        return found

    def assert_no_lock_keys(self, timeout: float = 3.0) -> None:
        """Wait (briefly) until no quorum node holds a lock key."""
        try:
            wait_for(lambda: not any(self.lock_keys().values()), timeout, "lock keys to go")
        except AssertionError:
            raise AssertionError(f"lock keys left behind: {self.lock_keys()}") from None

    def assert_every_key_expires(self, *kinds: str) -> None:
        """Every ``{prefix}:{kind}:*`` key on the quorum nodes has a TTL: none outlives its use."""
        for node in self.quorum:
            with node.client() as client:
                for kind in kinds:
                    for key in client.scan_iter(f"{self.prefix}:{kind}:*"):
                        assert client.pttl(key) > 0, key

    def assert_nothing_left(self) -> None:
        """Every quorum node answers and holds no lock or permit key (fence keys are kept).

        The topology fixtures call it when their module ends, whichever tests ran.
        """
        every = self.quorum.keys(f"{self.prefix}:*")
        assert set(every) == set(range(len(self.quorum))), f"a quorum node is down: {every}"
        self.assert_no_lock_keys()

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


def make_topology(
    prefix: str,
    clusters: bool = False,
    postgres: bool = False,
    etcd: bool = False,
    zookeeper: bool = False,
    zookeeper_shape: tuple[int, int] = (1, 3),
) -> Topology:
    """The hub and the lock nodes: three masters, three Redis Clusters of three
    masters each, (``postgres``) one PostgreSQL server alone, (``etcd``) one
    etcd cluster of one member alone, or (``zookeeper``) ZooKeeper ensembles,
    ``zookeeper_shape`` (how many, members in each): one of three by default."""
    hub = RedisNode()
    try:
        if zookeeper:
            from celery_redlock.testing.zookeeper import ZookeeperEnsembles

            ensembles, members = zookeeper_shape
            quorum: Any = ZookeeperEnsembles(ensembles, size=members)
        elif etcd:
            from celery_redlock.testing.etcd import EtcdClusters

            quorum = EtcdClusters(1, size=1)
        elif postgres:
            from celery_redlock.core.nodes import node_for
            from celery_redlock.core.nodes import postgres as kind
            from celery_redlock.testing.postgres import PostgresServers

            quorum = PostgresServers(1)
            # as a deployment does (celery redlock schema --apply): no first call
            # of a worker or producer pays for creating it
            kind.install(node_for(quorum.urls[0], 1.0))
        else:
            quorum = RedisClusters(3, masters=3) if clusters else RedisNodes(3)
    except BaseException:
        hub.close()
        raise
    # A PostgreSQL call costs a commit, an etcd call a raft commit, and either stalls
    # longer than a Redis node does on a loaded 2-core host: the timeout the docs advise.
    # Three clusters of three masters are nine servers and their clients' routing: on
    # that host their renewal rounds outlasted the default 50 ms, and each such round
    # loses a lease by design (the heartbeat's page); 3x the default for them.
    return Topology(
        hub,
        quorum,
        prefix,
        node_timeout=0.5 if postgres or etcd or zookeeper else 0.15 if clusters else None,
        min_ttl=2.0 if etcd else None,
    )


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


def _send(env: dict, calls: list[tuple[str, str, dict]]) -> None:
    app = app_from_env(env, main="producer")
    try:
        for task, key, kwargs in calls:
            app.tasks[f"lockapp.{task}"].delay(key, **kwargs)
    finally:
        app.close()


def senders(topology: Topology, calls: list, processes: int = 4) -> list:
    """Started producer processes (forked), sending ``task(key, **kwargs)`` for each
    ``(task, key, kwargs)`` of ``calls`` among them, all at once."""
    ctx = multiprocessing.get_context("fork")
    env = topology.env(0, 1)
    procs = [ctx.Process(target=_send, args=(env, calls[i::processes])) for i in range(processes)]
    for p in procs:
        p.start()
    return procs


def new_run() -> str:
    """A unique id for one test's records and lock keys."""
    return uuid.uuid4().hex
