#!/usr/bin/env python3
"""The cost of one enqueue call: a claiming ``.delay()`` beside plain Celery,
celery-once and celery-singleton, in ONE run.

No worker consumes: every call publishes to the Redis broker (or, for a
duplicate, finds the key taken and publishes nothing), and the queue is purged
between repetitions. Calls timed:

* ``plain``: ``.delay()`` of a plain ``@app.task``, the reference for "x plain";
* ``redlock-1`` / ``redlock-3``: ``.delay()`` of a ``LockedTask`` with
  ``lock_enqueue="until_finished"`` on 1 / 3 lock nodes (the tasks
  ``celery_tasks.py`` registers), with a fresh key every call (claim on the
  quorum, then publish);
* ``redlock-1-dup`` / ``redlock-3-dup``: the same with the key already claimed
  (the claim is found; nothing is published; the claimed task's
  ``AsyncResult`` comes back);
* ``once`` / ``once-dup``: celery-once ``QueueOnce`` (``graceful=False``), its
  Redis backend on one node; the duplicate raises ``AlreadyQueued``, caught;
  ``once`` is the reference of the targets;
* ``singleton`` / ``singleton-dup``: celery-singleton ``Singleton``, one node;
  the duplicate returns the queued task's ``AsyncResult``.

Topology: ``celery_tasks.py``'s (one broker server: broker db 1, celery-once
db 2, celery-singleton db 3; three lock nodes beside it), started here and
stopped at the end. Inside each repetition the calls take turns in blocks of
``--block``, in an order that rotates every block (as in ``locks.py``); the
figure per call is the median of the per-rep means, "per-rep x" the range of
the ratio taken inside each rep, "client CPU" this process's CPU per call.
Between reps the queue, the celery-once and celery-singleton dbs and the lock
nodes are emptied, so the claims and the keys do not pile up.

Usage::

    python benchmarks/enqueue.py                 # 7 reps x 1000 calls each, under 1 min
    python benchmarks/enqueue.py --quick         # 3 reps x 200, about 5 s
    python benchmarks/enqueue.py --json out.json --md out.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import celery_tasks as _ct  # noqa: E402  (benchmarks/celery_tasks.py: the app and the nodes)
from locks import _row, _table, cpu_model, finish, loadavg, log, pct, versions  # noqa: E402

WARMUP_CALLS = 50

#: (key, task name in celery_tasks.make_app, duplicate?, label)
CALLS = [
    ("plain", "crl_bench.plain", False, "plain Celery"),
    ("redlock-1", "crl_bench.redlock_1_enqueue", False, "celery_redlock claim, 1 node"),
    ("redlock-3", "crl_bench.redlock_3_enqueue", False, "celery_redlock claim, 3 nodes"),
    ("once", "crl_bench.once", False, "celery-once QueueOnce"),
    ("singleton", "crl_bench.singleton", False, "celery-singleton Singleton"),
    ("redlock-1-dup", "crl_bench.redlock_1_enqueue", True, "celery_redlock claim, 1 node"),
    ("redlock-3-dup", "crl_bench.redlock_3_enqueue", True, "celery_redlock claim, 3 nodes"),
    ("once-dup", "crl_bench.once", True, "celery-once QueueOnce"),
    ("singleton-dup", "crl_bench.singleton", True, "celery-singleton Singleton"),
]
LABELS = {k: label for k, _, _, label in CALLS}

#: (id, description, call, reference, limit): call / reference <= limit
TARGETS = [
    ("enqueue-1", "claiming .delay(), 1 node: <= 1.0x celery-once's .delay()",
     "redlock-1", "once", 1.0),
    ("enqueue-3", "claiming .delay(), 3 nodes: <= 1.5x celery-once's .delay()",
     "redlock-3", "once", 1.5),
]  # fmt: skip


# --------------------------------------------------------------------------- #
# measurement
# --------------------------------------------------------------------------- #
def make_call(task: Any, dup: bool, prefix: str) -> Callable[[int], Any]:
    """One enqueue of ``task``: a fresh argument per ``i``, or always the claimed one."""
    from celery_once import AlreadyQueued

    delay = task.delay
    if not dup:
        return lambda i: delay(f"{prefix}-{i}")
    arg = f"{prefix}-dup"

    def call(i: int) -> Any:
        try:
            return delay(arg)
        except AlreadyQueued:
            return None

    return call


def run_calls(call: Callable[[int], Any], start: int, n: int, out: list[float]) -> None:
    """n calls; appends per-call microseconds to out."""
    clock = time.perf_counter_ns
    for i in range(start, start + n):
        t = clock()
        call(i)
        out.append((clock() - t) / 1e3)


def reset(broker: str, lock_nodes: Any) -> None:
    """Empty the queue, celery-once's and celery-singleton's dbs, and the lock nodes."""
    import redis

    for db in (1, 2, 3):
        with redis.Redis.from_url(f"{broker}/{db}") as c:
            c.flushdb()
    lock_nodes.flushall()


def bench(app: Any, broker: str, lock_nodes: Any, keys: list[str], reps: int, n: int,
          block: int) -> dict[str, Any]:  # fmt: skip
    import redis

    names = {k: (t, dup) for k, t, dup, _ in CALLS}
    tasks = {k: app.tasks[names[k][0]] for k in keys}
    cpu_clock = time.process_time_ns
    data: dict[str, dict[str, Any]] = {
        k: {"label": LABELS[k], "dup": names[k][1], "rep_means": [], "samples": [],
            "cpu_rep_means": []}
        for k in keys
    }  # fmt: skip
    queued: list[dict[str, int]] = []
    blocks = [block] * (n // block) + ([n % block] if n % block else [])
    qc = redis.Redis.from_url(f"{broker}/1")
    for rep in range(-1, reps):  # rep -1: warm-up (connections, script cache, plans)
        reset(broker, lock_nodes)
        calls = {k: make_call(tasks[k], names[k][1], f"r{rep}-{k}") for k in keys}
        for k in keys:  # the duplicates' key is claimed (queued) once, untimed
            if names[k][1]:
                calls[k](0)
        published_before = qc.llen(_ct.QUEUE)
        if rep < 0:
            for k in keys:
                run_calls(calls[k], 1, WARMUP_CALLS, [])
            continue
        t_rep = time.monotonic()
        samples: dict[str, list[float]] = {k: [] for k in keys}
        cpu = dict.fromkeys(keys, 0)
        done = 1
        for b, size in enumerate(blocks):
            j = (rep * len(blocks) + b) % len(keys)
            for k in keys[j:] + keys[:j]:
                c0 = cpu_clock()
                run_calls(calls[k], done, size, samples[k])
                cpu[k] += cpu_clock() - c0
            done += size
        fresh = sum(1 for k in keys if not names[k][1])
        queued.append({"expected": published_before + fresh * n, "queued": qc.llen(_ct.QUEUE)})
        for k in keys:
            d = data[k]
            d["rep_means"].append(statistics.fmean(samples[k]))
            d["samples"].extend(samples[k])
            d["cpu_rep_means"].append(cpu[k] / 1e3 / len(samples[k]))
        log(f"rep {rep + 1}/{reps} done in {time.monotonic() - t_rep:.1f} s: "
            + ", ".join(f"{k} {data[k]['rep_means'][-1]:.0f}" for k in keys)
            + f" us (loadavg {loadavg()})")  # fmt: skip
    reset(broker, lock_nodes)
    qc.close()
    return {"calls": data, "queued": queued}


# --------------------------------------------------------------------------- #
# analysis and report
# --------------------------------------------------------------------------- #
def _ratio(raw: dict[str, Any], k: str, ref: str) -> tuple[float, list[float]]:
    """Median of k over median of ref, and the same ratio inside each rep."""
    a, b = raw["calls"][k]["rep_means"], raw["calls"][ref]["rep_means"]
    return statistics.median(a) / statistics.median(b), [x / y for x, y in zip(a, b)]


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    calls = raw["calls"]
    out: dict[str, Any] = {}
    for k in (k for k in LABELS if k in calls):  # in the order of CALLS
        d = calls[k]
        us = statistics.median(d["rep_means"])
        s: dict[str, Any] = {"label": d["label"], "dup": d["dup"], "us": us, "per_s": 1e6 / us,
                             "p50_us": pct(d["samples"], 0.5), "p99_us": pct(d["samples"], 0.99),
                             "cpu_us": statistics.median(d["cpu_rep_means"])}  # fmt: skip
        for ref in ("plain", "once"):
            if ref in calls:
                s[f"x_{ref}"], s[f"x_{ref}_reps"] = _ratio(raw, k, ref)
        base = k.removesuffix("-dup")
        if d["dup"] and base in calls:
            s["x_fresh"], s["x_fresh_reps"] = _ratio(raw, k, base)
        if d["dup"] and "once-dup" in calls:
            s["x_once_dup"], s["x_once_dup_reps"] = _ratio(raw, k, "once-dup")
        out[k] = s
    return out


def evaluate(raw: dict[str, Any], summ: dict[str, Any]) -> list[dict[str, Any]]:
    res = []
    for tid, desc, k, ref, limit in TARGETS:
        if k not in summ or ref not in summ:
            continue
        value, per_rep = _ratio(raw, k, ref)
        res.append({"id": tid, "target": desc, "value": value, "limit": limit,
                    "per_rep": per_rep, "reps_passing": sum(1 for v in per_rep if v <= limit),
                    "pass": value <= limit})  # fmt: skip
    ok = all(q["queued"] == q["expected"] for q in raw["queued"])
    res.append({"id": "dup-publishes-nothing",
                "target": "a duplicate publishes nothing (queue length = fresh calls + 1 per "
                          "duplicated key)",
                "value": "; ".join(f"{q['queued']}/{q['expected']}" for q in raw["queued"]),
                "pass": ok, "per_rep": [], "reps_passing": None})  # fmt: skip
    return res


def _x(s: dict[str, Any], name: str) -> str:
    if name not in s:
        return ""
    reps = s[f"{name}_reps"]
    return f"{s[name]:.2f} ({min(reps):.2f}-{max(reps):.2f})"


def render(meta: dict[str, Any], raw: dict[str, Any], summ: dict[str, Any], targets: list) -> str:
    vers = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
    out = [f"## celery_redlock enqueue benchmark ({meta['started']})", ""]
    out.append(
        f"{meta['cpus']} CPUs ({meta['cpu_model']}), {meta['platform']}, Python {meta['python']}, "
        f"redis-server {meta['redis_server']} on loopback: 1 broker server + {_ct.LOCK_NODES} "
        f"lock nodes; {vers}."
    )
    out.append(
        f"{meta['reps']} reps x {meta['n']} calls each, interleaved in blocks of {meta['block']} "
        f"in rotating order; no worker; queue purged between reps; loadavg "
        f"{meta['loadavg_start']} -> {meta['loadavg_end']}; {meta['duration_s']:.0f} s."
    )
    out.append("")
    rows = []
    for s in summ.values():
        rows.append(_row(
            s["label"], "duplicate" if s["dup"] else "fresh key", f"{s['us']:.0f}",
            f"{s['per_s']:.0f}", f"{s['p50_us']:.0f}", f"{s['p99_us']:.0f}",
            f"**{_x(s, 'x_plain')}**", f"**{_x(s, 'x_once')}**",
            _x(s, "x_once_dup"), _x(s, "x_fresh"), f"{s['cpu_us']:.0f}",
        ))  # fmt: skip
    out += ["### One .delay()", ""]
    out += _table(
        ["task", "call", "us/call", "calls/s", "p50 us", "p99 us", "x plain (per rep)",
         "x celery-once fresh (per rep)", "x celery-once dup", "x own fresh", "client CPU us"],
        rows,
    )  # fmt: skip
    out += _ct.targets_section(targets)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    fmt = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    ap.add_argument("--reps", type=int, default=7, help="repetitions (default 7)")
    ap.add_argument("--n", type=int, default=1000, help="calls per kind per rep (default 1000)")
    ap.add_argument(
        "--block",
        type=int,
        default=100,
        help="calls of one kind before switching to the next (default 100)",
    )
    ap.add_argument(
        "--calls",
        default=",".join(LABELS),
        help="which calls (default: all; plain and once are always included)",
    )
    ap.add_argument("--quick", action="store_true", help="3 reps x 200 in blocks of 50: about 5 s")
    ap.add_argument("--json", metavar="PATH", help="save every sample and the summary here")
    ap.add_argument("--md", metavar="PATH", help="also write the Markdown report here")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 if a target fails")
    a = ap.parse_args(argv)  # fmt: skip
    if a.quick:
        a.reps, a.n, a.block = 3, 200, 50
    keys = ["plain", "once"] + [k for k in a.calls.split(",") if k and k not in ("plain", "once")]
    for k in keys:
        if k not in LABELS:
            ap.error(f"unknown call {k!r}; known: {', '.join(LABELS)}")
    import redis

    t0 = time.monotonic()
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
        "versions": versions("celery_redlock", "celery", "kombu", "redis", "celery_once",
                             "celery-singleton", "prometheus_client", "hiredis"),
        "hiredis_available": bool(redis.utils.HIREDIS_AVAILABLE),
        "loadavg_start": loadavg(), "reps": a.reps, "n": a.n, "block": a.block, "calls": keys,
        "enqueue_mode": _ct.ENQUEUE_MODE,
    }  # fmt: skip
    log(f"starting 1 broker + {_ct.LOCK_NODES} lock redis-server nodes on loopback ...")
    with _ct.start_nodes() as (broker_node, lock_nodes):
        with broker_node.client() as c:
            meta["redis_server"] = c.info("server")["redis_version"]
        broker, app = _ct.app_on(broker_node, lock_nodes)
        log(f"broker on {broker_node.port}, lock nodes on {[nd.port for nd in lock_nodes]}; "
            f"{a.reps} reps x {a.n} x {len(keys)} calls")  # fmt: skip
        raw = bench(app, broker, lock_nodes, keys, a.reps, a.n, a.block)
    meta["loadavg_end"] = loadavg()
    meta["duration_s"] = time.monotonic() - t0
    summ = summarize(raw)
    targets = evaluate(raw, summ)
    return finish(a, meta, raw, summ, targets, render(meta, raw, summ, targets))


if __name__ == "__main__":
    sys.exit(main())
