#!/usr/bin/env python3
"""End-to-end Celery task throughput: plain vs celery_redlock vs the de-dup plugins, in ONE run.

A real ``celery worker`` subprocess with a Redis broker runs a no-op task
(``INCR`` a counter; the task that reaches the target ``RPUSH``es a marker).
The producer enqueues N tasks with distinct arguments and times from the first
``apply_async`` until its ``BLPOP`` on the marker returns: the method of the
anchors harness (``bench/anchors_bench.py``, section ``celery``). Variants:

* ``plain``: ``@app.task``, the reference: every ratio is to it;
* ``redlock-1`` / ``redlock-3``: ``LockedTask`` on 1 / 3 lock nodes, default
  settings except the nodes (fencing on, heartbeat on, TTL 10 s), one lock key
  per argument, the fencing token passed in (``adapters.locked_task``, the same
  task the harness's ``--celery-candidate adapters:celery_task`` registers);
* ``redlock-3-lazy``: the same on 3 nodes, but ``run`` does not take the token,
  so it is never issued: the acquire moves no fence value, and is a bare
  ``SET NX PX`` on each node (no script) unless a node refuses it;
* ``redlock-3-enqueue``: ``redlock-3`` with ``lock_enqueue="until_finished"``:
  ``apply_async`` claims the key on the 3 nodes before publishing, the worker
  takes the lock under the claim and drops it at the end (distinct arguments,
  so nothing is deduplicated: every task must still run exactly once);
* ``redlock-3-rate``: ``redlock-3`` with ``lock_rate="10/s"`` per key: every
  start books its key's rate in its run lock's round (no round more), never
  delayed (each key starts once): what a rated start costs under its limit;
* ``redlock-1pg``: ``redlock-1`` on one PostgreSQL lock node instead (a
  server started here; left out, with a line saying why, where none can be
  started or with ``--no-postgres``);
* ``once``: celery-once ``QueueOnce`` (``graceful=False``), Redis backend on db 2
  of the broker server;
* ``singleton``: celery-singleton ``Singleton``, backend on db 3 of the broker
  server;
* ``floor-3``: no library, the least any execution-time lock on 3 nodes can
  send: one ``SET key 1 NX PX`` round before the body and one ``DEL`` round
  after it, on raw non-blocking sockets to the same three lock nodes, one
  ``poll`` per round (no Lua, no fencing, no checks, no heartbeat). What it
  costs is what the lock servers and the kernel take; its ratio bounds every
  3-node variant;
* ``floor-3-scripts``: the same raw client running celery_redlock's own
  acquire and release scripts (fence values included): the difference to
  ``floor-3`` is what the scripts cost, the difference to ``redlock-3`` what
  the library's Python costs.

Topology (all on 127.0.0.1, started here with ``celery_redlock.testing`` and
stopped at the end): one **broker server** (broker db 1, celery-once db 2,
celery-singleton db 3, the counter db 0; the anchors put all of these on node
7001 too) and **three lock nodes**, separate from it, for celery_redlock.

One worker per pool (``--pool=solo`` and ``--pool=prefork -c 2`` by default)
serves every variant's task; results ignored, ``--without-gossip
--without-mingle --without-heartbeat``. It is this very module, imported as the
app (``celery -A celery_tasks:app``) and configured by environment variables
(``CELERY_REDLOCK_BENCH_BROKER``, ``CELERY_REDLOCK_BENCH_NODES``). Inside each
repetition the variants run one after another in an order that rotates every
rep; the figure is the median over reps, and "per-rep x" is the range of the
ratio to plain taken inside each rep.

Correctness is checked in the same run: after each run the counter must show
exactly N executions (none lost, none doubled), lock keys must be gone.

After the run, a solo worker on ``redlock-3`` runs once more under cProfile
(``--no-profile`` skips it): its listing is kept in ``--logdir`` as
``celery-worker-solo-redlock-3.txt`` (and ``.prof``), so the next change starts
from numbers.

Usage::

    python benchmarks/celery_tasks.py                 # 5 reps x 2000 tasks, ~4 min
    python benchmarks/celery_tasks.py --quick         # 3 reps x 300, ~1 min
    python benchmarks/celery_tasks.py --json out.json # also save the raw data
    python benchmarks/celery_tasks.py --profile redlock-3   # cProfile of a solo worker
"""

from __future__ import annotations

import argparse
import os
import platform
import pstats
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import adapters as _adapters  # noqa: E402  (benchmarks/adapters.py, next to this file)
from locks import cpu_model, finish, loadavg, log, versions  # noqa: E402

from celery_redlock.core.nodes import scripts  # noqa: E402
from celery_redlock.core.nodes.redis.wire import Partial, pack, parse  # noqa: E402  (the floor's wire)

HOST = "127.0.0.1"
QUEUE = "crl_bench"
COUNTER = "crl_bench:done"
DONE_LIST = "crl_bench:finished"
#: The counter is set to TARGET - n before a run; the task that brings it to
#: TARGET signals. The worker never needs to know n.
TARGET = 10**9
WARMUP_TASKS = 50
LOCK_NODES = 3
#: ``lock_enqueue`` of the claiming tasks: one in the system, queued or running.
ENQUEUE_MODE = "until_finished"

#: Base URL (no db) of the broker server: broker db 1, celery-once db 2,
#: celery-singleton db 3, counter db 0.
BROKER_ENV = "CELERY_REDLOCK_BENCH_BROKER"
NODES_ENV = _adapters.NODES_ENV  # the lock nodes, comma-separated URLs
#: The PostgreSQL lock node's URL, when there is one.
PG_ENV = "CELERY_REDLOCK_BENCH_PG"

#: (key, task name, label)
VARIANTS = [
    ("plain", "crl_bench.plain", "plain Celery"),
    ("redlock-1", "crl_bench.redlock_1", "celery_redlock, 1 node"),
    ("redlock-3", "crl_bench.redlock_3", "celery_redlock, 3 nodes"),
    ("redlock-3-lazy", "crl_bench.redlock_3_lazy", "celery_redlock, 3 nodes, token unread"),
    ("redlock-3-enqueue", "crl_bench.redlock_3_enqueue", "celery_redlock, 3 nodes, enqueue claim"),
    ("redlock-3-rate", "crl_bench.redlock_3_rate", "celery_redlock, 3 nodes, lock_rate"),
    ("redlock-1pg", "crl_bench.redlock_1pg", "celery_redlock, 1 PostgreSQL node"),
    ("once", "crl_bench.once", "celery-once QueueOnce"),
    ("singleton", "crl_bench.singleton", "celery-singleton Singleton"),
    ("floor-3", "crl_bench.floor_3", "floor: SET NX + DEL on 3 nodes, raw sockets"),
    ("floor-3-scripts", "crl_bench.floor_3_scripts", "floor with our acquire/release scripts"),
]
LABELS = {k: label for k, _, label in VARIANTS}

#: (id, description, pool, variant, minimum ratio to plain)
TARGETS = [
    ("celery-3-solo", "celery_redlock 3 nodes, solo pool: >= 0.9x plain",
     "solo:1", "redlock-3", 0.9),
    ("celery-3-prefork", "celery_redlock 3 nodes, prefork -c 2: >= 0.9x plain",
     "prefork:2", "redlock-3", 0.9),
]  # fmt: skip
#: (id, description, variant, reference variant, minimum ratio of the two), per pool
RELATIVE_TARGETS = [
    ("rate-cost", "a rated task under its limit: >= 1/1.2 of the same task without a rate",
     "redlock-3-rate", "redlock-3", 1 / 1.2),
    ("floor", "celery_redlock 3 nodes: >= 0.95x the floor-3 throughput",
     "redlock-3", "floor-3", 0.95),
    ("token-unread", "token unread: at least as fast as token read",
     "redlock-3-lazy", "redlock-3", 1.0),
    ("claim-vs-once", "enqueue claim: >= 0.9x celery-once",
     "redlock-3-enqueue", "once", 0.9),
]  # fmt: skip
#: (id, description, variant, reference, CPU part, maximum ratio), per pool: the
#: variant's CPU per task over the reference's, for the worker counted above
#: plain's (what the lock adds), for the lock nodes as measured.
CPU_TARGETS = [
    ("worker-cpu", "worker's added CPU per task: <= 1.3x the floor's",
     "redlock-3", "floor-3", "worker", 1.3),
    ("lock-nodes-cpu", "lock nodes' CPU per task: <= 1.5x the floor's",
     "redlock-3", "floor-3", "lock_servers", 1.5),
]  # fmt: skip
#: The rate of the rated variant: per key, and each key starts once.
RATE = "10/s"


# --------------------------------------------------------------------------- #
# the app: producer and worker import the same thing
# --------------------------------------------------------------------------- #
_app = None
_body_client = None


def _broker_base() -> str:
    return os.environ.get(BROKER_ENV, f"redis://{HOST}:6379").rstrip("/")


def _task_body() -> None:
    """The no-op body: count the execution; the one that reaches TARGET signals."""
    global _body_client
    if _body_client is None:
        import redis

        _body_client = redis.Redis.from_url(_broker_base() + "/0")
    if _body_client.incr(COUNTER) == TARGET:
        _body_client.rpush(DONE_LIST, 1)


class _FloorNodes:
    """Raw non-blocking sockets to the lock nodes, per process: a round writes one
    command to every node, then reads the replies as one ``poll`` reports them."""

    def __init__(self, urls: list[str]):
        import socket
        from urllib.parse import urlsplit

        self.pid = os.getpid()
        self.socks = {}
        for url in urls:
            parts = urlsplit(url)
            sock = socket.create_connection((parts.hostname, parts.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks[sock.fileno()] = sock
        for script in (scripts.ACQUIRE, scripts.RELEASE):
            self.round(b"SCRIPT", b"LOAD", script.text.encode())
        for sock in self.socks.values():
            sock.setblocking(False)

    def round(self, *args: bytes) -> None:
        command = pack(args)
        poller = select.poll()
        waiting = {}
        for fd, sock in self.socks.items():
            sock.sendall(command)
            poller.register(fd, select.POLLIN)
            waiting[fd] = b""
        while waiting:
            for fd, _ in poller.poll(5000):
                buf = waiting[fd] + self.socks[fd].recv(65536)
                try:
                    reply = parse(buf, 0)[0]
                except Partial:
                    waiting[fd] = buf
                    continue
                if isinstance(reply, Exception):
                    raise reply
                poller.unregister(fd)
                del waiting[fd]


_floor: _FloorNodes | None = None


def _floor_task_body(i: Any, with_scripts: bool) -> None:
    """The no-op body between a floor acquire round and a floor release round."""
    global _floor
    if _floor is None or _floor.pid != os.getpid():
        _floor = _FloorNodes(_adapters.celery_nodes()[:LOCK_NODES])
    key = f"crl_bench:floor:{i}".encode()
    if with_scripts:
        now = b"%d" % (time.time_ns() // 1000)
        acquire = (scripts.ACQUIRE.sha.encode(), b"2", key, key + b":f", b"o", b"10000", b"9", now)
        _floor.round(b"EVALSHA", *acquire)
        release: tuple[bytes, ...] = (b"EVALSHA", scripts.RELEASE.sha.encode(), b"1", key, b"o")
    else:
        _floor.round(b"SET", key, b"1", b"NX", b"PX", b"10000")
        release = (b"DEL", key)
    try:
        _task_body()
    finally:
        _floor.round(*release)


def make_app() -> Any:
    """The app on the broker of ``$CELERY_REDLOCK_BENCH_BROKER``, with every variant's task."""
    from celery import Celery
    from celery_once import QueueOnce
    from celery_singleton import Singleton

    base = _broker_base()
    nodes = _adapters.celery_nodes()
    app = Celery("crl_bench", broker=base + "/1")
    app.conf.update(
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # celery-once: its Redis backend on db 2, library default lock timeout (1 h)
        ONCE={"backend": "celery_once.backends.Redis",
              "settings": {"url": base + "/2", "default_timeout": 60 * 60}},
        # celery-singleton: its own db 3
        singleton_backend_url=base + "/3",
    )  # fmt: skip

    @app.task(name="crl_bench.plain")
    def plain(i: Any) -> None:
        _task_body()

    _adapters.locked_task(app, _task_body, name="crl_bench.redlock_1", nodes=nodes[:1])
    _adapters.locked_task(app, _task_body, name="crl_bench.redlock_3", nodes=nodes[:LOCK_NODES])
    _adapters.locked_task(
        app, _task_body, name="crl_bench.redlock_3_lazy", nodes=nodes[:LOCK_NODES], token=False
    )
    _adapters.locked_task(app, _task_body, name="crl_bench.redlock_3_rate",
                          nodes=nodes[:LOCK_NODES], lock_rate=RATE)  # fmt: skip
    if os.environ.get(PG_ENV):
        _adapters.locked_task(
            app, _task_body, name="crl_bench.redlock_1pg", nodes=[os.environ[PG_ENV]]
        )
    for n_nodes in (1, LOCK_NODES):  # enqueue-time claims; enqueue.py times their .delay()
        _adapters.locked_task(app, _task_body, name=f"crl_bench.redlock_{n_nodes}_enqueue",
                              nodes=nodes[:n_nodes], lock_enqueue=ENQUEUE_MODE)  # fmt: skip

    @app.task(name="crl_bench.once", base=QueueOnce, once={"graceful": False})
    def once(i: Any) -> None:
        _task_body()

    @app.task(name="crl_bench.singleton", base=Singleton)
    def singleton(i: Any) -> None:
        _task_body()

    @app.task(name="crl_bench.floor_3")
    def floor_3(i: Any) -> None:
        _floor_task_body(i, with_scripts=False)

    @app.task(name="crl_bench.floor_3_scripts")
    def floor_3_scripts(i: Any) -> None:
        _floor_task_body(i, with_scripts=True)

    return app


def __getattr__(name: str) -> Any:  # PEP 562: ``celery -A celery_tasks:app`` builds the app lazily
    global _app
    if name == "app":
        if _app is None:
            _app = make_app()
        return _app
    raise AttributeError(name)


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def _median(values: list[float]) -> float:
    """The median of the numbers that are not NaN (a run that did not finish has no rate)."""
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


class CPUMeter:
    """CPU seconds (user + system) of processes, read from psutil (None without it).

    ``worker`` counts the worker's main process and its pool children.
    """

    def __init__(self, worker_pid: int, broker_pid: int | None, lock_pids: list[int | None]):
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is optional
            self.psutil = None
            return
        self.psutil = psutil
        self.worker = psutil.Process(worker_pid)
        self.broker = psutil.Process(broker_pid) if broker_pid else None
        self.locks = [psutil.Process(p) for p in lock_pids if p]

    @staticmethod
    def _cpu(proc: Any) -> float:
        t = proc.cpu_times()
        return t.user + t.system

    def snapshot(self) -> dict[str, float] | None:
        if self.psutil is None:
            return None
        procs = [self.worker] + self.worker.children(recursive=True)
        worker = 0.0
        for p in procs:
            try:
                worker += self._cpu(p)
            except self.psutil.NoSuchProcess:  # pragma: no cover
                pass
        return {
            "worker": worker,
            "producer": time.process_time(),
            "broker_server": self._cpu(self.broker) if self.broker else 0.0,
            "lock_servers": sum(self._cpu(p) for p in self.locks),
        }


# --------------------------------------------------------------------------- #
# worker subprocess
# --------------------------------------------------------------------------- #
def worker_env(broker: str, nodes: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    # Absolute: the worker runs from this directory, where "." names another tree.
    paths = [HERE, *(os.environ.get("PYTHONPATH") or "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths if p)
    env[BROKER_ENV] = broker
    env[NODES_ENV] = ",".join(nodes)
    return env


def worker_cmd(pool: str, conc: int, prefix: list[str] | None = None) -> list[str]:
    return [
        *(prefix or [sys.executable]), "-m", "celery", "-A", "celery_tasks:app", "worker",
        f"--pool={pool}", f"--concurrency={conc}", "-Q", QUEUE, "--loglevel=WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"crl_bench_{pool}@%h",
    ]  # fmt: skip


def start_worker(cmd: list[str], env: dict[str, str], logpath: str) -> subprocess.Popen:
    with open(logpath, "wb") as lf:
        # Its own session: stopping it reaches its pool children, and only them.
        return subprocess.Popen(cmd, cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=lf,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def stop_worker(p: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM (warm shutdown) to the worker we started, then SIGKILL its own process group."""
    if p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the session we created for it: pgid == its pid
        p.wait(timeout=10)
    try:  # pool children left behind by a worker that died
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------- #
# one run: n tasks of one variant
# --------------------------------------------------------------------------- #
def one_run(task: Any, r0: Any, queue_client: Any, n: int, run_id: str, meter: CPUMeter | None,
            stall_s: float = 20.0, deadline_s: float = 600.0) -> dict[str, Any]:  # fmt: skip
    """Enqueue n tasks with distinct args; time until the last one completes; check the count."""
    start_count = TARGET - n
    r0.set(COUNTER, start_count)
    r0.delete(DONE_LIST)
    cpu0 = meter.snapshot() if meter else None
    t0 = time.perf_counter_ns()
    for i in range(n):
        task.apply_async(args=(f"{run_id}-{i}",))
    t_enq = time.perf_counter_ns()
    got = None
    last, last_change = -1, time.monotonic()
    hard = time.monotonic() + deadline_s
    while not got:
        # short BLPOP timeouts: redis-py 8 has a 5 s default socket_timeout
        got = r0.blpop(DONE_LIST, timeout=1)
        if got:
            break
        count = int(r0.get(COUNTER) or 0)
        now = time.monotonic()
        if count != last:
            last, last_change = count, now
        elif now - last_change > stall_s or now > hard:
            break
    t_end = time.perf_counter_ns()
    cpu1 = meter.snapshot() if meter else None
    executed = _settle(r0, queue_client) - start_count
    out: dict[str, Any] = {
        "run_id": run_id, "n": n, "executed": executed, "finished": bool(got),
        "total_s": (t_end - t0) / 1e9, "enqueue_s": (t_enq - t0) / 1e9,
        "tasks_per_s": n / ((t_end - t0) / 1e9) if got else float("nan"),
        "enqueue_per_s": n / ((t_enq - t0) / 1e9), "loadavg": loadavg(),
    }  # fmt: skip
    if cpu0 and cpu1:
        out["cpu_us_per_task"] = {k: (cpu1[k] - cpu0[k]) * 1e6 / n for k in cpu0}
    return out


def _settle(r0: Any, queue_client: Any, quiet_s: float = 0.15, limit_s: float = 10.0) -> int:
    """The counter once the queue is empty and the counter stopped moving (late duplicates land)."""
    end = time.monotonic() + limit_s
    prev = None
    while True:
        count = int(r0.get(COUNTER) or 0)
        if count == prev and queue_client.llen(QUEUE) == 0:
            return count
        if time.monotonic() > end:
            return count
        prev = count
        time.sleep(quiet_s)


def lock_leftovers(broker: str, node_urls: list[str], pg: Any = None) -> dict[str, Any]:
    import redis

    out: dict[str, Any] = {}
    for db, name in ((2, "once_db2_keys"), (3, "singleton_db3_keys")):
        with redis.Redis.from_url(f"{broker}/{db}") as c:
            out[name] = c.dbsize()
    locks, claims, fences = [], [], []
    for url in node_urls:
        with redis.Redis.from_url(url) as c:
            locks.append(sum(1 for _ in c.scan_iter(match="redlock:lock:*", count=1000)))
            claims.append(sum(1 for _ in c.scan_iter(match="redlock:claim:*", count=1000)))
            fences.append(sum(1 for _ in c.scan_iter(match="redlock:fence:*", count=1000)))
    if pg is not None:
        locks.append(len(pg.keys("%:lock:%")))
        claims.append(len(pg.keys("%:claim:%")))
    out["redlock_lock_keys_per_node"] = locks
    out["redlock_claim_keys_per_node"] = claims
    out["redlock_fence_keys_per_node"] = fences
    return out


def bench_pool(app: Any, pool: str, conc: int, variants: list[str], reps: int, n: int,
               broker_node: Any, lock_nodes: Any, logdir: str,
               pg: Any = None) -> dict[str, Any]:  # fmt: skip
    import redis

    broker = broker_node.url.rsplit("/", 1)[0]
    node_urls = lock_nodes.urls
    names = dict((k, t) for k, t, _ in VARIANTS)
    tasks = {k: app.tasks[names[k]] for k in variants}
    r0 = redis.Redis.from_url(broker + "/0")
    qc = redis.Redis.from_url(broker + "/1")
    for db in (1, 2, 3):  # broker queue, celery-once locks, celery-singleton locks
        with redis.Redis.from_url(f"{broker}/{db}") as c:
            c.flushdb()
    lock_nodes.flushall()
    if pg is not None:
        pg.flush()
    logpath = os.path.join(logdir, f"celery-worker-{pool}-{conc}.log")
    w = start_worker(worker_cmd(pool, conc), worker_env(broker, node_urls), logpath)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    try:
        meter = CPUMeter(w.pid, broker_node.pid, [nd.pid for nd in lock_nodes])
        t_w = time.monotonic()
        for k in variants:  # warm-up; the first one also waits for the worker to be ready
            r = one_run(tasks[k], r0, qc, WARMUP_TASKS, f"warm-{k}-{uuid.uuid4().hex[:6]}", None,
                        stall_s=60)  # fmt: skip
            if not r["finished"] or r["executed"] != WARMUP_TASKS:
                raise RuntimeError(f"warm-up of {k} on --pool={pool} failed: {r}; see {logpath}")
        log(f"--pool={pool} -c {conc}: worker up and warm in {time.monotonic() - t_w:.1f} s")
        for rep in range(reps):
            k0 = rep % len(variants)
            order = variants[k0:] + variants[:k0]
            t_rep = time.monotonic()
            for k in order:
                r = one_run(tasks[k], r0, qc, n, f"{rep}-{k}-{uuid.uuid4().hex[:8]}", meter)
                r["rep"], r["position"] = rep, order.index(k)
                runs[k].append(r)
                if not r["finished"] or r["executed"] != n:
                    log(f"  !! {k}: {r['executed']} of {n} executed (finished={r['finished']})")
            tps = ", ".join(f"{k} {runs[k][-1]['tasks_per_s']:.0f}" for k in variants)
            log(f"  rep {rep + 1}/{reps} in {time.monotonic() - t_rep:.1f} s: {tps} tasks/s "
                f"(loadavg {loadavg()})")  # fmt: skip
        time.sleep(0.2)
        leftovers = lock_leftovers(broker, node_urls, pg)
    finally:
        stop_worker(w)
        r0.close()
        qc.close()
    return {"pool": pool, "concurrency": conc, "worker": f"--pool={pool} --concurrency={conc}",
            "runs": runs, "leftovers": leftovers, "worker_log": logpath}  # fmt: skip


# --------------------------------------------------------------------------- #
# analysis and report
# --------------------------------------------------------------------------- #
def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pkey, p in raw["pools"].items():
        runs = p["runs"]
        plain_by_rep = {r["rep"]: r["tasks_per_s"] for r in runs["plain"]}
        plain_tps = _median([r["tasks_per_s"] for r in runs["plain"]])
        res: dict[str, Any] = {}
        for k, rs in runs.items():
            tps = _median([r["tasks_per_s"] for r in rs])
            paired = [r["tasks_per_s"] / plain_by_rep[r["rep"]] for r in rs]
            cpu = {}
            if all("cpu_us_per_task" in r for r in rs):
                for part in rs[0]["cpu_us_per_task"]:
                    cpu[part] = _median([r["cpu_us_per_task"][part] for r in rs])
            res[k] = {
                "label": LABELS[k],
                "tasks_per_s": tps,
                "us_per_task": 1e6 / tps,
                "overhead_us_vs_plain": 1e6 / tps - 1e6 / plain_tps,
                "x_plain": tps / plain_tps,
                "x_plain_per_rep": [min(paired), max(paired)],
                "x_plain_reps": paired,
                "tasks_per_s_reps": [r["tasks_per_s"] for r in rs],
                "enqueue_per_s": _median([r["enqueue_per_s"] for r in rs]),
                "cpu_us_per_task": cpu,
                "exactly_once": all(r["finished"] and r["executed"] == r["n"] for r in rs),
                "executed": [r["executed"] for r in rs],
            }
        out[pkey] = res
    return out


def evaluate(summ: dict[str, Any], raw: dict[str, Any]) -> list[dict[str, Any]]:
    res = []
    for tid, desc, pool, variant, limit in TARGETS:
        if pool not in summ or variant not in summ[pool]:
            continue
        s = summ[pool][variant]
        per_rep = s["x_plain_reps"]
        res.append({"id": tid, "target": desc, "value": s["x_plain"], "limit": limit,
                    "per_rep": per_rep, "reps_passing": sum(1 for v in per_rep if v >= limit),
                    "pass": s["x_plain"] >= limit})  # fmt: skip
    for tid, desc, variant, reference, limit in RELATIVE_TARGETS:
        for pool, variants in summ.items():
            if variant not in variants or reference not in variants:
                continue
            got, ref = variants[variant], variants[reference]
            per_rep = [a / b for a, b in zip(got["x_plain_reps"], ref["x_plain_reps"]) if b]
            value = got["x_plain"] / ref["x_plain"] if ref["x_plain"] else 0.0
            res.append({"id": f"{tid} {pool}", "target": f"{desc} ({pool})",
                        "value": value, "limit": limit,
                        "per_rep": per_rep, "reps_passing": sum(1 for v in per_rep if v >= limit),
                        "pass": value >= limit})  # fmt: skip
    for tid, desc, variant, reference, part, limit in CPU_TARGETS:
        for pool, variants in summ.items():
            got, ref = variants.get(variant), variants.get(reference)
            if not got or not ref or not got["cpu_us_per_task"] or not ref["cpu_us_per_task"]:
                continue
            base = variants["plain"]["cpu_us_per_task"][part] if part == "worker" else 0.0
            added, ref_added = (
                got["cpu_us_per_task"][part] - base,
                ref["cpu_us_per_task"][part] - base,
            )
            value = added / ref_added if ref_added > 0 else float("inf")
            res.append({"id": f"{tid} {pool}", "target": f"{desc} ({pool}; {added:.0f} vs "
                        f"{ref_added:.0f} us)", "value": value, "limit": limit, "per_rep": [],
                        "reps_passing": None, "pass": value <= limit})  # fmt: skip
    ok = all(v["exactly_once"] for p in summ.values() for v in p.values())
    clean = all(
        not any(p["leftovers"]["redlock_lock_keys_per_node"])
        and not any(p["leftovers"]["redlock_claim_keys_per_node"])
        and p["leftovers"]["once_db2_keys"] == 0
        and p["leftovers"]["singleton_db3_keys"] == 0
        for p in raw["pools"].values()
    )
    runs = sum(len(v["executed"]) for p in summ.values() for v in p.values())
    res.append({"id": "exactly-once", "target": "every task executed exactly once, every variant",
                "value": f"{runs} runs checked", "pass": ok, "per_rep": [],
                "reps_passing": None})  # fmt: skip
    res.append({"id": "no-lock-left", "target": "no lock or claim key left after the runs",
                "value": "checked per pool", "pass": clean, "per_rep": [],
                "reps_passing": None})  # fmt: skip
    return res


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[str]) -> list[str]:
    return [_row(*header), _row(*["---"] * len(header)), *rows, ""]


def render(meta: dict[str, Any], raw: dict[str, Any], summ: dict[str, Any], targets: list) -> str:
    vers = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    out = [f"## celery_redlock Celery task benchmark ({meta['started']})", ""]
    out.append(
        f"{meta['cpus']} CPUs ({meta['cpu_model']}), {meta['platform']}, Python {meta['python']}, "
        f"redis-server {meta['redis_server']} on loopback: 1 broker server + {LOCK_NODES} lock "
        f"nodes{' + 1 PostgreSQL lock node' if meta.get('postgres_node') else ''}; {vers}."
    )
    out.append(
        f"{meta['reps']} reps x {meta['n']} tasks per variant and pool, variants in rotating "
        f"order; results ignored; no-op body (INCR, the last one RPUSH); first enqueue -> last "
        f"completion. loadavg {meta['loadavg_start']} -> {meta['loadavg_end']}; "
        f"{meta['duration_s']:.0f} s."
    )
    loads = [r["loadavg"][0] for p in raw["pools"].values() for rs in p["runs"].values()
             for r in rs if r["loadavg"]]  # fmt: skip
    if loads:
        out.append(f"1-min loadavg at the end of each run: {min(loads):.2f}-{max(loads):.2f} "
                   f"(median {_median(loads):.2f}) on {meta['cpus']} CPUs.")  # fmt: skip
    out.append("")
    rows = []
    for pkey, res in summ.items():
        worker = raw["pools"][pkey]["worker"]
        for k, s in res.items():
            lo, hi = s["x_plain_per_rep"]
            cpu = s["cpu_us_per_task"]
            rows.append(_row(
                worker, s["label"], f"{s['tasks_per_s']:.0f}", f"**{s['x_plain']:.2f}**",
                f"{lo:.2f}-{hi:.2f}", f"{s['us_per_task']:.0f}",
                "–" if k == "plain" else f"{s['overhead_us_vs_plain']:+.0f}",
                f"{s['enqueue_per_s']:.0f}",
                f"{cpu['worker']:.0f}" if cpu else "?", f"{cpu['producer']:.0f}" if cpu else "?",
                f"{cpu['broker_server']:.0f}" if cpu else "?",
                f"{cpu['lock_servers']:.0f}" if cpu else "?",
                "[" + ", ".join(f"{v:.0f}" for v in s["tasks_per_s_reps"]) + "]",
                "yes" if s["exactly_once"] else f"**NO** {s['executed']}",
            ))  # fmt: skip
    out += ["### Throughput", ""]
    out += _table(
        ["worker", "task", "tasks/s", "x plain", "per-rep x", "us/task", "+us/task vs plain",
         "enqueue/s", "worker CPU us/task", "producer CPU us/task", "broker CPU us/task",
         "lock nodes CPU us/task", "reps (tasks/s)", "exactly once"],
        rows,
    )  # fmt: skip
    for p in raw["pools"].values():
        out.append(f"Left after the runs, {p['worker']}: {p['leftovers']}.")
    out.append("")
    out += targets_section(targets, "Load averages per run are in the JSON.")
    return "\n".join(out) + "\n"


def targets_section(targets: list[dict[str, Any]], note: str = "") -> list[str]:
    """The "Targets" table: ratio targets with their per-rep ranges, then the checks."""
    rows = []
    for t in targets:
        if isinstance(t["value"], float) and not t["per_rep"]:  # a CPU ratio: no per-rep
            rows.append(_row(t["target"], f"{t['value']:.3f}x", "", "",
                             "PASS" if t["pass"] else "**FAIL**"))  # fmt: skip
        elif t["per_rep"]:
            rows.append(_row(t["target"], f"{t['value']:.3f}x",
                             f"{min(t['per_rep']):.2f}-{max(t['per_rep']):.2f}",
                             f"{t['reps_passing']}/{len(t['per_rep'])}",
                             "PASS" if t["pass"] else "**FAIL**"))  # fmt: skip
        else:
            rows.append(_row(t["target"], t["value"], "", "", "PASS" if t["pass"] else "**FAIL**"))
    out = ["### Targets", ""]
    out += _table(["target", "measured", "per-rep range", "reps passing", "result"], rows)
    judged = "The result is judged on the medians; the per-rep columns show how firm it is."
    out.append(f"{judged} {note}".rstrip())
    return out


# --------------------------------------------------------------------------- #
# profile: one solo worker under cProfile
# --------------------------------------------------------------------------- #
def profile(variant: str, n: int, reps: int, outdir: str, top: int) -> int:
    """A solo worker under cProfile runs ``reps`` x n tasks of ``variant``; print the top."""
    import redis

    nodes_ctx = start_nodes()
    with nodes_ctx as (broker_node, lock_nodes, _):
        broker, app = app_on(broker_node, lock_nodes)
        task = app.tasks[dict((k, t) for k, t, _ in VARIANTS)[variant]]
        prof = os.path.join(outdir, f"celery-worker-solo-{variant}.prof")
        logpath = os.path.join(outdir, f"celery-worker-solo-{variant}.log")
        cmd = worker_cmd("solo", 1, [sys.executable, "-m", "cProfile", "-o", prof])
        w = start_worker(cmd, worker_env(broker, lock_nodes.urls), logpath)
        r0 = redis.Redis.from_url(broker + "/0")
        qc = redis.Redis.from_url(broker + "/1")
        try:
            r = one_run(task, r0, qc, WARMUP_TASKS, "warm", None, stall_s=60)
            for rep in range(reps):
                r = one_run(task, r0, qc, n, f"p{rep}-{uuid.uuid4().hex[:6]}", None)
                log(f"{variant}: {r['tasks_per_s']:.0f} tasks/s under cProfile, "
                    f"{r['executed']}/{n} executed")  # fmt: skip
        finally:
            stop_worker(w, timeout=60)
            r0.close()
            qc.close()
    if not os.path.exists(prof):
        log(f"no profile written; see {logpath}")
        return 1
    text = os.path.splitext(prof)[0] + ".txt"
    with open(text, "w") as out:
        for stream in (out, sys.stdout):
            st = pstats.Stats(prof, stream=stream)
            st.sort_stats("cumulative").print_stats(top)
            st.sort_stats("tottime").print_stats(top)
    log(f"profile in {prof}, as text in {text}")
    return 0


# --------------------------------------------------------------------------- #
# main
# --------------------------------------------------------------------------- #
class start_nodes:
    """The broker server, the lock nodes and (``postgres``) one PostgreSQL
    server, stopped on exit (also on Ctrl-C)."""

    def __init__(self, postgres: bool = False) -> None:
        self.postgres = postgres
        self.pg: Any = None

    def __enter__(self) -> tuple[Any, Any, Any]:
        from celery_redlock.testing import RedisNode, RedisNodes

        self.broker = RedisNode()
        try:
            self.locks = RedisNodes(LOCK_NODES)
            if self.postgres:
                from celery_redlock.testing.postgres import PostgresServer

                self.pg = PostgresServer()
        except BaseException:
            self.__exit__()
            raise
        return self.broker, self.locks, self.pg

    def __exit__(self, *exc: object) -> None:
        for server in (self.pg, getattr(self, "locks", None), self.broker):
            if server is not None:
                server.close()


def app_on(broker_node: Any, lock_nodes: Any, pg: Any = None) -> tuple[str, Any]:
    """The broker server's URL (no db) and the app on it, on ``lock_nodes``
    and on the PostgreSQL server ``pg``, if any.

    Also sets the environment variables a worker started from here reads.
    """
    broker = broker_node.url.rsplit("/", 1)[0]
    os.environ[BROKER_ENV] = broker
    os.environ[NODES_ENV] = ",".join(lock_nodes.urls)
    if pg is not None:
        os.environ[PG_ENV] = pg.url
    return broker, make_app()


def parse_pools(text: str) -> list[tuple[str, int]]:
    out = []
    for item in text.split(","):
        pool, _, conc = item.partition(":")
        out.append((pool.strip(), int(conc or 1)))
    return out


def main(argv: list[str] | None = None) -> int:
    fmt = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    ap.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    ap.add_argument("--n", type=int, default=2000, help="tasks per variant per rep (default 2000)")
    ap.add_argument(
        "--pools",
        default="solo:1,prefork:2",
        help="worker pools, POOL:CONCURRENCY comma-separated (default solo:1,prefork:2)",
    )
    ap.add_argument(
        "--variants",
        default=",".join(k for k, _, _ in VARIANTS),
        help="which variants (default: all; plain is always included)",
    )
    ap.add_argument("--quick", action="store_true", help="3 reps x 300 tasks: about 1 min")
    ap.add_argument("--json", metavar="PATH", help="save every run and the summary here")
    ap.add_argument("--md", metavar="PATH", help="also write the Markdown report here")
    ap.add_argument(
        "--strict",
        action="store_true",
        help="exit with status 1 if a target or the correctness check fails",
    )
    ap.add_argument("--logdir", default=None, help="worker logs (default: a temporary directory)")
    ap.add_argument(
        "--profile",
        metavar="VARIANT",
        default=None,
        help="instead: run a solo worker under cProfile on VARIANT and print the top",
    )
    ap.add_argument("--top", type=int, default=40, help="rows of the --profile listing")
    ap.add_argument(
        "--no-postgres", action="store_true", help="leave out the PostgreSQL node (redlock-1pg)"
    )
    ap.add_argument(
        "--no-profile",
        dest="keep_profile",
        action="store_false",
        help="skip the CPU profile of a solo worker on redlock-3 kept in --logdir after the run",
    )
    a = ap.parse_args(argv)  # fmt: skip
    if a.quick:
        a.reps, a.n = 3, 300
    logdir = a.logdir or tempfile.mkdtemp(prefix="crl-celery-bench-")
    os.makedirs(logdir, exist_ok=True)
    if a.profile:
        if a.profile not in LABELS:
            ap.error(f"--profile: one of {', '.join(LABELS)}")
        return profile(a.profile, a.n, a.reps, logdir, a.top)
    variants = ["plain"] + [v for v in a.variants.split(",") if v and v != "plain"]
    for v in variants:
        if v not in LABELS:
            ap.error(f"unknown variant {v!r}; known: {', '.join(LABELS)}")
    pools = parse_pools(a.pools)
    from celery_redlock.testing.postgres import postgres_missing

    missing = "--no-postgres" if a.no_postgres else postgres_missing()
    if "redlock-1pg" in variants and missing:
        log(f"no PostgreSQL node, redlock-1pg left out: {missing}")
        variants.remove("redlock-1pg")

    t0 = time.monotonic()
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
        "versions": versions(
            "celery_redlock", "celery", "kombu", "billiard", "redis", "celery_once",
            "celery-singleton", "prometheus_client", "hiredis",
        ), "loadavg_start": loadavg(), "reps": a.reps, "n": a.n,
        "pools": [f"{p}:{c}" for p, c in pools], "variants": variants, "lock_nodes": LOCK_NODES,
        "warmup_tasks": WARMUP_TASKS, "logdir": logdir,
    }  # fmt: skip
    log(f"starting 1 broker + {LOCK_NODES} lock redis-server nodes on loopback ...")
    raw: dict[str, Any] = {"pools": {}}
    with start_nodes(postgres="redlock-1pg" in variants) as (broker_node, lock_nodes, pg):
        with broker_node.client() as c:
            meta["redis_server"] = c.info("server")["redis_version"]
        meta["broker_port"] = broker_node.port
        meta["lock_ports"] = [nd.port for nd in lock_nodes]
        meta["postgres_node"] = pg is not None
        _, app = app_on(broker_node, lock_nodes, pg)
        log(f"broker on {broker_node.port}, lock nodes on {meta['lock_ports']}; {a.reps} reps "
            f"x {a.n} tasks x {len(variants)} variants; loadavg {loadavg()}")  # fmt: skip
        for pool, conc in pools:
            raw["pools"][f"{pool}:{conc}"] = bench_pool(
                app, pool, conc, variants, a.reps, a.n, broker_node, lock_nodes, logdir, pg
            )
    meta["loadavg_end"] = loadavg()
    meta["duration_s"] = time.monotonic() - t0
    if a.keep_profile and "redlock-3" in variants:
        # The next change starts from numbers: a solo worker's CPU profile on 3 nodes.
        profile("redlock-3", a.n, 1, logdir, a.top)
        meta["profile"] = os.path.join(logdir, "celery-worker-solo-redlock-3.txt")
    summ = summarize(raw)
    targets = evaluate(summ, raw)
    return finish(a, meta, raw, summ, targets, render(meta, raw, summ, targets))


if __name__ == "__main__":
    sys.exit(main())
