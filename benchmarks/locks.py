#!/usr/bin/env python3
"""Uncontended lock cost of celery_redlock next to redis-py and pottery, in ONE run.

Measures, for each lock, the same-key cycle (one lock object re-used, the same
key every cycle: acquire + release) and the extend latency (acquire once, then
extend to the full TTL again and again):

* celery_redlock ``Redlock`` at 1, 3 and 5 nodes, fencing on and fencing off;
* redis-py ``Lock`` on 1 node (the reference: every ratio is to it), extend as
  ``Lock.extend(ttl, replace_ttl=True)`` (without ``replace_ttl`` redis-py
  ADDS time, which is a different operation);
* pottery ``Redlock`` on 3 and 5 nodes;
* celery_redlock on 3 nodes that are each a Redis Cluster of 3 masters
  (``redis+cluster://``), beside the same lock on 3 plain masters
  (``--no-clusters`` leaves them out);
* celery_redlock on one PostgreSQL node, beside the raw lease-table floor on
  the same server (two statements: ``INSERT ... ON CONFLICT ... WHERE
  expired``, then ``UPDATE``), on a throwaway server of its own that flushes
  each commit (``fsync`` on, as a lock node runs: the target is judged
  here); the same pair on a second server with ``fsync`` off is reported
  beside it, where commits cost no flush and the statements' and the
  clients' own cost shows (``--no-postgres`` leaves them out; skipped where
  PostgreSQL is missing);
* celery_redlock on one etcd node (a one-member cluster), beside etcd's own
  lock service (``/v3/lock/lock`` + ``unlock`` on one lease) through the same
  gateway (``--no-etcd`` leaves them out; skipped where etcd is missing);
* celery_redlock on one ZooKeeper node (a one-member ensemble), beside
  kazoo's own ``Lock`` recipe on the same ensemble (``--no-zookeeper``
  leaves them out; skipped where ZooKeeper is missing).

It starts its own redis-server nodes on free loopback ports
(``celery_redlock.testing.RedisNodes``) and stops them at the end. Inside each
repetition the locks take turns in blocks of ``--block`` cycles, in an order
that rotates every block, so that background load on a noisy machine falls on
all of them alike. The figure per lock is the median of the per-rep means;
p50/p99 are over every sample; "per-rep x" is the range of the ratios taken
inside each repetition; "client CPU" is this process's CPU time per cycle.

Usage::

    python benchmarks/locks.py                 # 7 reps x 1000 cycles, ~2.5 min
    python benchmarks/locks.py --quick         # ~20 s smoke run
    python benchmarks/locks.py --json out.json # also save the raw data
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import adapters as _adapters  # noqa: E402  (benchmarks/adapters.py, next to this file)

HOST = "127.0.0.1"
N_NODES = 5
WARMUP_CYCLES = 50
WARMUP_EXTENDS = 20
PING_N = 500

#: The key of celery_redlock on 3 Redis Cluster nodes (3 masters each).
CLUSTERS_KEY = "celery_redlock-3clusters"

#: (id, description, kind, lock key, reference key, limit)
#: kind "max": lock/reference <= limit; kind "min": reference/lock >= limit.
TARGETS = [
    ("cycle-3-nofence", "3 nodes, fencing off: cycle <= 1.5x redis-py", "cycle",
     "celery_redlock-3-nofence", "redispy", ("max", 1.5)),
    ("cycle-3-fence", "3 nodes, fencing on: cycle <= 2x redis-py", "cycle",
     "celery_redlock-3", "redispy", ("max", 2.0)),
    ("cycle-5-fence", "5 nodes, fencing on: cycle <= 2.5x redis-py", "cycle",
     "celery_redlock-5", "redispy", ("max", 2.5)),
    ("vs-pottery-3", "3 nodes, fencing on: >= 4x faster than pottery (3 nodes)", "cycle",
     "celery_redlock-3", "pottery-3", ("min", 4.0)),
    ("vs-pottery-5", "5 nodes, fencing on: >= 4x faster than pottery (5 nodes)", "cycle",
     "celery_redlock-5", "pottery-5", ("min", 4.0)),
    ("extend-3", "3 nodes: extend <= 1.5x redis-py Lock.extend(replace_ttl=True)", "extend",
     "celery_redlock-3", "redispy", ("max", 1.5)),
    ("cycle-3-clusters", "3 clusters of 3 masters: cycle <= 1.3x 3 plain masters", "cycle",
     CLUSTERS_KEY, "celery_redlock-3", ("max", 1.3)),
    ("extend-3-clusters", "3 clusters of 3 masters: extend <= 1.3x 3 plain masters", "extend",
     CLUSTERS_KEY, "celery_redlock-3", ("max", 1.3)),
    ("cycle-1pg-floor", "1 PostgreSQL node (fsync on): cycle <= 1.3x the raw lease-table floor",
     "cycle", "celery_redlock-1pg", "pg-floor", ("max", 1.3)),
    ("cycle-1pg-like", "1 PostgreSQL node: cycle ratio to the floor, release unflushed (reported)",
     "cycle", "celery_redlock-1pg", "pg-floor-unflushed-release", ("max", 10.0)),
    ("cycle-1pg-nofsync", "1 PostgreSQL node, fsync off: cycle ratio to its floor (reported)",
     "cycle", "celery_redlock-1pg-nofsync", "pg-floor-nofsync", ("max", 10.0)),
    ("cycle-1pg-vs-3", "1 PostgreSQL node against 3 Redis masters: cycle ratio (reported)",
     "cycle", "celery_redlock-1pg", "celery_redlock-3", ("max", 10.0)),
    ("cycle-1etcd-service", "1 etcd node: cycle <= etcd's own lock service (same gateway)",
     "cycle", "celery_redlock-1etcd", "etcd-lock", ("max", 1.0)),
    ("cycle-1etcd-vs-3", "1 etcd node against 3 Redis masters: cycle ratio (reported)",
     "cycle", "celery_redlock-1etcd", "celery_redlock-3", ("max", 20.0)),
    ("cycle-1zk-recipe", "1 ZooKeeper node: cycle <= kazoo's Lock recipe (same ensemble)",
     "cycle", "celery_redlock-1zk", "kazoo-lock", ("max", 1.0)),
    ("cycle-1zk-vs-3", "1 ZooKeeper node against 3 Redis masters: cycle ratio (reported)",
     "cycle", "celery_redlock-1zk", "celery_redlock-3", ("max", 20.0)),
]  # fmt: skip


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def finish(a: Any, meta: dict, raw: Any, summ: Any, targets: list[dict], md: str) -> int:
    """Print the report, save it where ``--md`` / ``--json`` say; the exit status."""
    print(md)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(md)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"meta": meta, "summary": summ, "targets": targets, "raw": raw}, fh)
        log(f"wrote {a.json}")
    return 1 if a.strict and not all(t["pass"] for t in targets) else 0


def versions(*packages: str) -> dict[str, str | None]:
    """Installed versions of ``packages`` (None for those missing)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for pkg in packages:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def durable_and_not(n: int) -> list[Any]:
    """No servers, or two: one that flushes each commit (``fsync`` on), one that does not."""
    from celery_redlock.testing.postgres import PostgresServer

    servers: list[Any] = []
    try:
        for fsync in ("on", "off")[:n]:
            servers.append(PostgresServer(settings={"fsync": fsync}))
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers


def start_nodes(n: int) -> Any:
    from celery_redlock.testing import RedisNodes

    return RedisNodes(n)


def cluster_adapter(urls: list[str]) -> Any:
    """celery_redlock, fencing on, on nodes that are each a Redis Cluster."""
    ad = _adapters.CeleryRedlockAdapter(urls, fencing=True)
    ad.key = CLUSTERS_KEY
    ad.label = f"celery_redlock ({len(urls)} clusters of 3 masters, fencing on)"
    return ad


# --------------------------------------------------------------------------- #
# measurement
# --------------------------------------------------------------------------- #
def run_cycles(ad: Any, h: Any, n: int, out: list[float]) -> None:
    """n same-key acquire+release cycles; appends per-cycle microseconds to out."""
    clock = time.perf_counter_ns
    acquire, release = ad.acquire, ad.release
    for _ in range(n):
        t = clock()
        if not acquire(h):
            raise RuntimeError(f"{ad.label}: uncontended acquire failed")
        release(h)
        out.append((clock() - t) / 1e3)


def run_extends(ad: Any, h: Any, n: int, out: list[float]) -> None:
    """n extends of a held lock; appends per-extend microseconds to out."""
    clock = time.perf_counter_ns
    extend = ad.extend
    for _ in range(n):
        t = clock()
        extend(h)
        out.append((clock() - t) / 1e3)


def hold(ad: Any, key: str) -> Any:
    h = ad.new(key)
    if not ad.acquire(h):
        raise RuntimeError(f"{ad.label}: acquire before extend failed")
    return h


def run_pings(client: Any, n: int) -> list[float]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t = clock()
        client.ping()
        out.append((clock() - t) / 1e3)
    return out


def bench(
    nodes: list[tuple[str, int]],
    reps: int,
    n: int,
    block: int,
    clusters: list[str] | None = None,
    postgres: list[str] | None = None,
    etcd: str | None = None,
    zookeeper: str | None = None,
) -> dict[str, Any]:
    """reps x n cycles and n extends per lock, interleaved in blocks of ``block``.

    Inside a rep every lock runs ``block`` cycles, then the next lock does, and
    so on round the list (the order rotates every block), then the same for
    extends, until each lock has n of each. Background load on a shared
    machine then lands on all locks alike instead of on whichever lock was
    running when it came.
    """
    import redis

    cpu_clock = time.process_time_ns  # CPU of this process (all its threads): client cost only
    ads = _adapters.reference_adapters(nodes) + _adapters.adapters(nodes)
    if clusters:
        ads.append(cluster_adapter(clusters))
    if postgres:  # [durable, fsync off]
        ads += _adapters.postgres_adapters(postgres[0])
        ads += _adapters.postgres_adapters(postgres[1], durable=False)
    if etcd:
        ads += _adapters.etcd_adapters(etcd)
    if zookeeper:
        ads += _adapters.zookeeper_adapters(zookeeper)
    ping_client = redis.Redis(host=nodes[0][0], port=nodes[0][1])
    # Same key and one lock object for every cycle of a lock, but no key shared
    # between locks: pottery's release returns at quorum, and its calls to the
    # other nodes finish in background threads, which could still hold the key
    # when the next lock's acquire comes.
    handles = {ad.key: ad.new(f"cycle:{ad.key}") for ad in ads}
    for ad in ads:  # warm-up: connections, script cache
        run_cycles(ad, handles[ad.key], WARMUP_CYCLES, [])
        h = hold(ad, f"warm:{ad.key}")
        run_extends(ad, h, WARMUP_CYCLES, [])
        ad.release(h)
    run_pings(ping_client, 50)

    data: dict[str, dict[str, Any]] = {
        ad.key: {"label": ad.label, "n_nodes": ad.n_nodes, "fencing": getattr(ad, "fencing", None),
                 "cycle_rep_means": [], "extend_rep_means": [], "cycle_samples": [],
                 "extend_samples": [], "cycle_cpu_rep_means": [], "extend_cpu_rep_means": []}
        for ad in ads
    }  # fmt: skip
    pings: dict[str, list] = {"rep_medians": [], "samples": []}
    blocks = [block] * (n // block) + ([n % block] if n % block else [])
    for rep in range(reps):
        t_rep = time.monotonic()
        p = run_pings(ping_client, PING_N)
        pings["rep_medians"].append(statistics.median(p))
        pings["samples"].extend(p)
        cyc: dict[str, list[float]] = {ad.key: [] for ad in ads}
        ext: dict[str, list[float]] = {ad.key: [] for ad in ads}
        cpu_cyc = dict.fromkeys(cyc, 0)
        cpu_ext = dict.fromkeys(cyc, 0)
        held = {ad.key: hold(ad, f"extend-{rep}:{ad.key}") for ad in ads}
        for ad in ads:
            run_extends(ad, held[ad.key], WARMUP_EXTENDS, [])
        for b, size in enumerate(blocks):
            k = (rep * len(blocks) + b) % len(ads)
            order = ads[k:] + ads[:k]
            for ad in order:
                c0 = cpu_clock()
                run_cycles(ad, handles[ad.key], size, cyc[ad.key])
                cpu_cyc[ad.key] += cpu_clock() - c0
            for ad in order:
                c0 = cpu_clock()
                run_extends(ad, held[ad.key], size, ext[ad.key])
                cpu_ext[ad.key] += cpu_clock() - c0
        for ad in ads:
            ad.release(held[ad.key])
            d = data[ad.key]
            d["cycle_rep_means"].append(statistics.fmean(cyc[ad.key]))
            d["cycle_samples"].extend(cyc[ad.key])
            d["extend_rep_means"].append(statistics.fmean(ext[ad.key]))
            d["extend_samples"].extend(ext[ad.key])
            d["cycle_cpu_rep_means"].append(cpu_cyc[ad.key] / 1e3 / len(cyc[ad.key]))
            d["extend_cpu_rep_means"].append(cpu_ext[ad.key] / 1e3 / len(ext[ad.key]))
        log(f"rep {rep + 1}/{reps} done in {time.monotonic() - t_rep:.1f} s (loadavg {loadavg()})")
    for ad in ads:
        if hasattr(ad, "stats"):
            data[ad.key]["stats"] = dict(ad.stats)
        if hasattr(ad, "close"):
            ad.close()
    ping_client.close()
    return {"locks": data, "ping": pings}


# --------------------------------------------------------------------------- #
# analysis and report
# --------------------------------------------------------------------------- #
def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    locks = raw["locks"]
    base = locks["redispy"]
    out: dict[str, Any] = {}
    for key, d in locks.items():
        s: dict[str, Any] = {
            "label": d["label"],
            "n_nodes": d["n_nodes"],
            "fencing": d["fencing"],
            "stats": d.get("stats"),
        }
        for kind in ("cycle", "extend"):
            means = d[f"{kind}_rep_means"]
            m = statistics.median(means)
            bm = statistics.median(base[f"{kind}_rep_means"])
            paired = [a / b for a, b in zip(means, base[f"{kind}_rep_means"])]
            s[kind] = {
                "us": m,
                "per_s": 1e6 / m,
                "p50_us": pct(d[f"{kind}_samples"], 0.5),
                "p99_us": pct(d[f"{kind}_samples"], 0.99),
                "x_redispy": m / bm,
                "x_redispy_p50": pct(d[f"{kind}_samples"], 0.5) / pct(base[f"{kind}_samples"], 0.5),
                "cpu_us": statistics.median(d[f"{kind}_cpu_rep_means"]),
                "cpu_x_redispy": statistics.median(d[f"{kind}_cpu_rep_means"])
                / statistics.median(base[f"{kind}_cpu_rep_means"]),
                "x_redispy_per_rep": [min(paired), max(paired)],
            }
        out[key] = s
    return out


def evaluate(raw: dict[str, Any], summ: dict[str, Any]) -> list[dict[str, Any]]:
    res = []
    for tid, desc, kind, lock, ref, (op, limit) in TARGETS:
        if lock not in summ or ref not in summ:
            continue
        a = summ[lock][kind]["us"]
        b = summ[ref][kind]["us"]
        la = raw["locks"][lock][f"{kind}_rep_means"]
        lb = raw["locks"][ref][f"{kind}_rep_means"]
        if op == "max":
            value, per_rep = a / b, [x / y for x, y in zip(la, lb)]
            ok = value <= limit
            agree = sum(1 for v in per_rep if v <= limit)
        else:
            value, per_rep = b / a, [y / x for x, y in zip(la, lb)]
            ok = value >= limit
            agree = sum(1 for v in per_rep if v >= limit)
        res.append({"id": tid, "target": desc, "kind": kind, "lock": lock, "reference": ref,
                    "op": op, "limit": limit, "value": value, "per_rep": per_rep,
                    "reps_passing": agree, "pass": ok})  # fmt: skip
    return res


def _fence_txt(f: bool | None) -> str:
    return "–" if f is None else ("on" if f else "off")


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[str]) -> list[str]:
    return [_row(*header), _row(*["---"] * len(header)), *rows, ""]


def render(meta: dict[str, Any], raw: dict[str, Any], summ: dict[str, Any], targets: list) -> str:
    ping = statistics.median(raw["ping"]["rep_medians"])
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    out = [f"## celery_redlock lock benchmark ({meta['started']})", ""]
    out.append(
        f"{meta['cpus']} CPUs ({meta['cpu_model']}), {meta['platform']}, Python {meta['python']}, "
        f"redis-server {meta['redis_server']} x {meta['n_nodes']} on loopback; {versions}; "
        f"hiredis parser in use: {meta['hiredis_available']}."
    )
    out.append(
        f"{meta['reps']} reps x {meta['n']} same-key cycles and {meta['n']} extends per lock, "
        f"interleaved in blocks of {meta['block']} in rotating order; TTL {meta['ttl_s']:g} s; "
        f"loadavg {meta['loadavg_start']} -> {meta['loadavg_end']}; {meta['duration_s']:.0f} s; "
        f"redis-py PING median {ping:.0f} us."
    )
    out.append("")

    rows = []
    for key, s in summ.items():
        c = s["cycle"]
        pot = summ.get(f"pottery-{s['n_nodes']}")
        mine = key.startswith("celery_redlock")
        vs = f"{pot['cycle']['us'] / c['us']:.1f}x" if pot and mine else ""
        lo, hi = c["x_redispy_per_rep"]
        rows.append(_row(
            s["label"], s["n_nodes"], _fence_txt(s["fencing"]), f"{c['us']:.0f}",
            f"{c['per_s']:.0f}", f"{c['p50_us']:.0f}", f"{c['p99_us']:.0f}",
            f"**{c['x_redispy']:.2f}**", f"{lo:.2f}-{hi:.2f}", f"{c['x_redispy_p50']:.2f}",
            f"{c['cpu_us']:.0f}", f"{c['cpu_x_redispy']:.2f}", vs,
        ))  # fmt: skip
    out += ["### Acquire + release (same key)", ""]
    out += _table(
        ["lock", "nodes", "fencing", "us/cycle", "cycles/s", "p50 us", "p99 us", "x redis-py",
         "per-rep x", "x redis-py (p50)", "client CPU us", "CPU x redis-py", "pottery / this"],
        rows,
    )  # fmt: skip

    rows = []
    for s in summ.values():
        e = s["extend"]
        lo, hi = e["x_redispy_per_rep"]
        rows.append(_row(
            s["label"], s["n_nodes"], _fence_txt(s["fencing"]), f"{e['us']:.0f}",
            f"{e['per_s']:.0f}", f"{e['p50_us']:.0f}", f"{e['p99_us']:.0f}",
            f"**{e['x_redispy']:.2f}**", f"{lo:.2f}-{hi:.2f}", f"{e['x_redispy_p50']:.2f}",
            f"{e['cpu_us']:.0f}", f"{e['cpu_x_redispy']:.2f}",
        ))  # fmt: skip
    out += ["### Extend (reset to the full TTL)", ""]
    out += _table(
        ["lock", "nodes", "fencing", "us/extend", "extends/s", "p50 us", "p99 us",
         "x redis-py Lock.extend", "per-rep x", "x redis-py (p50)", "client CPU us",
         "CPU x redis-py"],
        rows,
    )  # fmt: skip

    slow = {v["label"]: v["stats"] for v in summ.values() if any((v.get("stats") or {}).values())}
    if slow:
        out.append(
            "Slow rounds (a node answered after `node_timeout`, 50 ms; their cost is in the "
            "figures above): "
            + "; ".join(
                f"{k}: {v['acquire_retries']} acquire retries, {v['extend_failures']} lost extends"
                for k, v in slow.items()
            )
            + "."
        )
    else:
        out.append("No celery_redlock acquire was retried and no extend failed.")
    out.append("")

    rows = []
    for t in targets:
        unit = "x" if t["op"] == "max" else "x faster"
        rows.append(_row(
            t["target"], f"{t['value']:.3f}{unit}",
            f"{min(t['per_rep']):.2f}-{max(t['per_rep']):.2f}",
            f"{t['reps_passing']}/{len(t['per_rep'])}", "PASS" if t["pass"] else "**FAIL**",
        ))  # fmt: skip
    out += ["### Targets", ""]
    out += _table(["target", "measured", "per-rep range", "reps passing", "result"], rows)
    out.append("The result is judged on the medians; the per-rep columns show how firm it is.")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    fmt = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    ap.add_argument("--reps", type=int, default=7, help="repetitions (default 7)")
    ap.add_argument(
        "--n", type=int, default=1000, help="cycles and extends per lock per rep (default 1000)"
    )
    ap.add_argument(
        "--block",
        type=int,
        default=100,
        help="cycles per lock before switching to the next lock (default 100)",
    )
    ap.add_argument("--quick", action="store_true", help="3 reps x 200 in blocks of 50: about 20 s")
    ap.add_argument(
        "--json", metavar="PATH", help="save raw data (every sample) and the summary here"
    )
    ap.add_argument("--md", metavar="PATH", help="also write the Markdown report here")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 if a target fails")
    ap.add_argument(
        "--no-clusters", action="store_true", help="leave out the 3 Redis Cluster nodes"
    )
    ap.add_argument(
        "--no-postgres", action="store_true", help="leave out the PostgreSQL node and its floor"
    )
    ap.add_argument(
        "--no-etcd", action="store_true", help="leave out the etcd node and etcd's lock service"
    )
    ap.add_argument(
        "--no-zookeeper", action="store_true",
        help="leave out the ZooKeeper node and kazoo's Lock recipe",
    )  # fmt: skip
    a = ap.parse_args(argv)
    if a.quick:
        a.reps, a.n, a.block = 3, 200, 50
    import redis

    t0 = time.monotonic()
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
        "versions": versions("celery_redlock", "redis", "pottery", "hiredis"),
        "hiredis_available": bool(redis.utils.HIREDIS_AVAILABLE),
        "loadavg_start": loadavg(), "reps": a.reps, "n": a.n, "block": a.block,
        "ttl_s": _adapters.TTL, "n_nodes": N_NODES,
    }  # fmt: skip
    from celery_redlock.testing import RedisClusters
    from celery_redlock.testing.etcd import EtcdClusters, etcd_missing
    from celery_redlock.testing.postgres import PostgresServers, postgres_missing
    from celery_redlock.testing.zookeeper import ZookeeperEnsembles, zookeeper_missing

    missing = None if a.no_postgres else postgres_missing()
    if missing:
        log(f"no PostgreSQL node: {missing}")
    no_etcd = None if a.no_etcd else etcd_missing()
    if no_etcd:
        log(f"no etcd node: {no_etcd}")
    no_zk = None if a.no_zookeeper else zookeeper_missing()
    if no_zk:
        log(f"no ZooKeeper node: {no_zk}")
    log(f"starting {N_NODES} redis-server nodes on loopback ...")
    with (
        start_nodes(N_NODES) as nodes,
        RedisClusters(0 if a.no_clusters else 3) as clusters,
        PostgresServers(servers=durable_and_not(0 if a.no_postgres or missing else 2)) as pg,
        EtcdClusters(0 if a.no_etcd or no_etcd else 1) as etcd,
        ZookeeperEnsembles(0 if a.no_zookeeper or no_zk else 1) as zk,
    ):
        addrs = [(HOST, node.port) for node in nodes]
        with nodes[0].client() as c:
            meta["redis_server"] = c.info("server")["redis_version"]
        meta["ports"] = [p for _, p in addrs]
        log(f"nodes up on ports {meta['ports']}; {a.reps} reps x {a.n}")
        raw = bench(
            addrs, a.reps, a.n, a.block, clusters.urls,
            pg.urls or None, etcd.urls[0] if etcd.urls else None,
            zk.urls[0] if zk.urls else None,
        )  # fmt: skip
    meta["loadavg_end"] = loadavg()
    meta["duration_s"] = time.monotonic() - t0
    summ = summarize(raw)
    targets = evaluate(raw, summ)
    return finish(a, meta, raw, summ, targets, render(meta, raw, summ, targets))


if __name__ == "__main__":
    sys.exit(main())
