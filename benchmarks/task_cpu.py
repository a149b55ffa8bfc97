#!/usr/bin/env python3
"""What one locked task call costs, without a broker: the caller's CPU and the lock nodes'.

``celery_tasks.py`` measures whole workers; their CPU per task moves with the
broker, the pool and the host by more than the lock's share. This script calls
the tasks in-process instead, as a worker's tracer does (a request pushed with
``called_directly=False``, then ``task(i)``), on 3 lock nodes of its own, so
the figures move less from run to run, and a run takes about a minute:

* ``plain``: ``@app.task`` with a no-op body, the reference for "added" CPU;
* ``floor-3``: ``celery_tasks.py``'s floor, one ``SET key 1 NX PX`` round and
  one ``DEL`` round on raw sockets around the body;
* ``redlock-3``: ``LockedTask`` on the 3 nodes, default settings (fencing on,
  heartbeat, receipts, the release not waited for), ``run`` takes the token;
* ``redlock-3-lazy``: the same, but ``run`` does not take the token.

Per call it reports the caller's CPU (``time.process_time``) and wall time,
and the lock nodes' CPU (``INFO cpu``, user + sys, summed over the nodes) and
commands (``INFO commandstats``). The variants run in turns, one batch each
per repetition, in short batches so that a slow spell of the host falls on
every variant alike; the figures are medians over the repetitions. The ratios are
those of ``celery_tasks.py``'s CPU targets: the caller's CPU above plain's
against the floor's (at most 1.3x), and the lock nodes' CPU against the
floor's (at most 1.5x).

Usage::

    python benchmarks/task_cpu.py              # 21 reps x 1000 calls, about 1 min
    python benchmarks/task_cpu.py --quick      # 5 reps x 300
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import adapters as _adapters  # noqa: E402  (benchmarks/adapters.py, next to this file)
from celery_tasks import _FloorNodes  # noqa: E402  (the floor's raw client)
from locks import cpu_model, finish, loadavg, log, versions  # noqa: E402

from celery_redlock.testing import RedisNodes  # noqa: E402

VARIANTS = ("plain", "floor-3", "redlock-3", "redlock-3-lazy")
#: (description, variant, part, maximum ratio to the floor's)
TARGETS = [
    ("caller's added CPU per call: <= 1.3x the floor's", "redlock-3", "added", 1.3),
    ("lock nodes' CPU per call: <= 1.5x the floor's", "redlock-3", "nodes", 1.5),
]


def make_tasks(urls: list[str]) -> dict[str, Any]:
    """The four tasks, on an app with an in-memory broker (nothing is published)."""
    from celery import Celery

    app = Celery("crl_task_cpu", broker="memory://")
    floor = _FloorNodes(urls)

    def body() -> None:
        pass

    @app.task(name="crl_task_cpu.plain")
    def plain(i: Any) -> None:
        body()

    @app.task(name="crl_task_cpu.floor_3")
    def floor_3(i: Any) -> None:
        key = b"crl_task_cpu:floor:%d" % i
        floor.round(b"SET", key, b"1", b"NX", b"PX", b"10000")
        try:
            body()
        finally:
            floor.round(b"DEL", key)

    return {
        "plain": plain,
        "floor-3": floor_3,
        "redlock-3": _adapters.locked_task(app, body, name="crl_task_cpu.redlock_3", nodes=urls),
        "redlock-3-lazy": _adapters.locked_task(
            app, body, name="crl_task_cpu.redlock_3_lazy", nodes=urls, token=False
        ),
    }


def node_counters(clients: list[Any]) -> tuple[float, int]:
    """The nodes' CPU seconds (user + sys) and commands so far, summed."""
    cpu, calls = 0.0, 0
    for client in clients:
        info = client.info("cpu")
        cpu += info["used_cpu_user"] + info["used_cpu_sys"]
        calls += sum(v["calls"] for v in client.info("commandstats").values())
    return cpu, calls


def batch(task: Any, first: int, n: int, clients: list[Any]) -> dict[str, float]:
    """``n`` calls of ``task`` as a worker makes them; per-call figures in microseconds."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    cpu0, calls0 = node_counters(clients)
    push, pop = task.push_request, task.pop_request
    wall0, own0 = time.perf_counter(), time.process_time()
    for i in range(first, first + n):
        push(id=ids[i - first], called_directly=False, is_eager=False, args=(i,), kwargs={})
        try:
            task(i)
        finally:
            pop()
    own, wall = time.process_time() - own0, time.perf_counter() - wall0
    cpu1, calls1 = node_counters(clients)
    # INFO's own commands: 2 per node per reading
    calls = calls1 - calls0 - 2 * len(clients)
    return {
        "cpu": own / n * 1e6,
        "wall": wall / n * 1e6,
        "nodes": (cpu1 - cpu0) / n * 1e6,
        "commands": calls / n / len(clients),
    }


def measure(reps: int, n: int, warmup: int = 200) -> dict[str, dict[str, float]]:
    """Medians over ``reps`` turns of every variant."""
    with RedisNodes(3) as nodes:
        urls = list(nodes.urls)
        tasks = make_tasks(urls)
        clients = [node.client() for node in nodes]
        first = 0
        for task in tasks.values():  # connections opened, scripts loaded, caches warm
            batch(task, first, warmup, clients)
            first += warmup
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for rep in range(reps):
            order = VARIANTS[rep % len(VARIANTS) :] + VARIANTS[: rep % len(VARIANTS)]
            for variant in order:
                runs[variant].append(batch(tasks[variant], first, n, clients))
                first += n
            log(f"rep {rep + 1}/{reps} done")
        for client in clients:
            client.close()
    return {v: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for v, rs in runs.items()}


def report(figures: dict[str, dict[str, float]]) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table and the targets, each with its figure and ``pass``."""
    plain = figures["plain"]["cpu"]
    floor = figures["floor-3"]
    added_floor = floor["cpu"] - plain
    lines = [
        "| variant | caller CPU us | added over plain | x floor's | wall us "
        "| lock nodes' CPU us | x floor's | commands per node |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratio: dict[str, dict[str, float]] = {}
    for v in VARIANTS:
        f = figures[v]
        added = f["cpu"] - plain
        ratio[v] = {"added": added / added_floor, "nodes": f["nodes"] / floor["nodes"]}
        x_added, x_nodes = (f"{ratio[v][part]:.2f}x" if v != "plain" else "-" for part in ratio[v])
        lines.append(
            f"| {v} | {f['cpu']:.0f} | {added:.0f} | {x_added} | {f['wall']:.0f} "
            f"| {f['nodes']:.0f} | {x_nodes} | {f['commands']:.1f} |"
        )
    lines += ["", "Commands per node count the calls a script makes.", ""]
    targets = []
    for description, variant, part, most in TARGETS:
        got = ratio[variant][part]
        targets.append({"target": description, "value": round(got, 3), "pass": got <= most})
        lines.append(f"- {'PASS' if got <= most else 'FAIL'} {description}: {got:.2f}x")
    return "\n".join(lines) + "\n", targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--reps", type=int, default=21, help="repetitions (default 21)")
    ap.add_argument("--n", type=int, default=1000, help="calls per variant per rep (default 1000)")
    ap.add_argument("--quick", action="store_true", help="5 reps x 300 calls")
    ap.add_argument("--json", metavar="PATH", help="save the figures and the targets here")
    ap.add_argument("--md", metavar="PATH", help="also write the Markdown report here")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 if a target fails")
    a = ap.parse_args(argv)
    if a.quick:
        a.reps, a.n = 5, 300
    meta = {
        "reps": a.reps,
        "n": a.n,
        "cpu": cpu_model(),
        "loadavg": loadavg(),
        "python": platform.python_version(),
        "versions": versions("celery", "redis"),
    }
    figures = measure(a.reps, a.n)
    md, targets = report(figures)
    return finish(a, meta, figures, None, targets, md)


if __name__ == "__main__":
    sys.exit(main())
