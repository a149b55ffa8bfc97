#!/usr/bin/env python3
"""Uncontended lock cost of celery_redlock next to redis-py and pottery, in ONE run.

Measures, for each lock, the same-key cycle (one lock object re-used, the same
key every cycle: acquire + release) and the extend latency (acquire once, then
extend to the full TTL again and again):

* celery_redlock ``Redlock`` at 1, 3 and 5 nodes, fencing on and fencing off;
* redis-py ``Lock`` on 1 node (the reference: every ratio is to it), extend as
  ``Lock.extend(ttl, replace_ttl=True)`` (without ``replace_ttl`` redis-py
  ADDS time, which is a different operation);
* pottery ``Redlock`` on 3 and 5 nodes.

It starts its own redis-server nodes on free loopback ports
(``celery_redlock.testing.RedisNodes``) and stops them at the end. Libraries
run in a rotating order across repetitions, so that drift on a noisy machine
spreads over all of them. The figure per lock is the median of the per-rep
means; p50/p99 are over every sample; "per-rep x" is the range of the ratios
taken inside each repetition (lock and reference measured seconds apart).

Usage::

    python benchmarks/locks.py                 # 7 reps x 1000 cycles, ~2 min
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
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import adapters as _adapters  # noqa: E402  (benchmarks/adapters.py, next to this file)

HOST = "127.0.0.1"
N_NODES = 5
WARMUP_CYCLES = 50
WARMUP_EXTENDS = 20
PING_N = 500

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


def versions() -> dict[str, Optional[str]]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Optional[str]] = {}
    for pkg in ("celery_redlock", "redis", "pottery", "hiredis"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def start_nodes(n: int) -> Any:
    try:
        from celery_redlock.testing import RedisNodes
    except ImportError as exc:  # testing.py is also a pytest plugin and imports pytest
        raise SystemExit(
            f"cannot import celery_redlock.testing ({exc}); "
            "install the test extra too: pip install -e '.[bench,test]'"
        ) from exc
    return RedisNodes(n)


# --------------------------------------------------------------------------- #
# measurement
# --------------------------------------------------------------------------- #
def run_cycles(ad: Any, h: Any, n: int) -> list[float]:
    """n same-key acquire+release cycles; per-cycle microseconds."""
    clock = time.perf_counter_ns
    acquire, release = ad.acquire, ad.release
    out = []
    for _ in range(n):
        t = clock()
        if not acquire(h):
            raise RuntimeError(f"{ad.label}: uncontended acquire failed")
        release(h)
        out.append((clock() - t) / 1e3)
    return out


def run_extends(ad: Any, key: str, n: int) -> list[float]:
    """Acquire once, warm up, then n extends; per-extend microseconds."""
    h = ad.new(key)
    if not ad.acquire(h):
        raise RuntimeError(f"{ad.label}: acquire before extend failed")
    clock = time.perf_counter_ns
    extend = ad.extend
    try:
        for _ in range(WARMUP_EXTENDS):
            extend(h)
        out = []
        for _ in range(n):
            t = clock()
            extend(h)
            out.append((clock() - t) / 1e3)
    finally:
        ad.release(h)
    return out


def run_pings(client: Any, n: int) -> list[float]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t = clock()
        client.ping()
        out.append((clock() - t) / 1e3)
    return out


def bench(nodes: list[tuple[str, int]], reps: int, n: int) -> dict[str, Any]:
    import redis

    ads = _adapters.reference_adapters(nodes) + _adapters.adapters(nodes)
    ping_client = redis.Redis(host=nodes[0][0], port=nodes[0][1])
    # Same key and one lock object for every cycle of a lock, but no key shared
    # between locks: pottery's release returns at quorum and may leave the key
    # on the other nodes until its TTL, which would stall the next lock's acquire.
    handles = {ad.key: ad.new(f"cycle:{ad.key}") for ad in ads}
    for ad in ads:  # warm-up: connections, script cache
        run_cycles(ad, handles[ad.key], WARMUP_CYCLES)
        run_extends(ad, f"warm:{ad.key}", WARMUP_CYCLES)
    run_pings(ping_client, 50)

    data: dict[str, dict[str, Any]] = {
        ad.key: {"label": ad.label, "n_nodes": ad.n_nodes, "fencing": getattr(ad, "fencing", None),
                 "cycle_rep_means": [], "extend_rep_means": [], "cycle_samples": [],
                 "extend_samples": []}
        for ad in ads
    }  # fmt: skip
    pings: dict[str, list] = {"rep_medians": [], "samples": []}
    for rep in range(reps):
        t_rep = time.monotonic()
        order = ads[rep % len(ads):] + ads[: rep % len(ads)]
        p = run_pings(ping_client, PING_N)
        pings["rep_medians"].append(statistics.median(p))
        pings["samples"].extend(p)
        for ad in order:
            d = data[ad.key]
            c = run_cycles(ad, handles[ad.key], n)
            d["cycle_rep_means"].append(statistics.fmean(c))
            d["cycle_samples"].extend(c)
            e = run_extends(ad, f"extend-{rep}:{ad.key}", n)
            d["extend_rep_means"].append(statistics.fmean(e))
            d["extend_samples"].extend(e)
        log(f"rep {rep + 1}/{reps} done in {time.monotonic() - t_rep:.1f} s (loadavg {loadavg()})")
    for ad in ads:
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
        s: dict[str, Any] = {"label": d["label"], "n_nodes": d["n_nodes"], "fencing": d["fencing"]}
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


def _fence_txt(f: Optional[bool]) -> str:
    return "–" if f is None else ("on" if f else "off")


def render(meta: dict[str, Any], raw: dict[str, Any], summ: dict[str, Any], targets: list) -> str:
    ping = statistics.median(raw["ping"]["rep_medians"])
    L = [f"## celery_redlock lock benchmark ({meta['started']})", ""]
    L.append(
        f"{meta['cpus']} CPUs ({meta['cpu_model']}), {meta['platform']}, Python {meta['python']}, "
        f"redis-server {meta['redis_server']} x {meta['n_nodes']} on loopback; "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + f"; hiredis parser in use: {meta['hiredis_available']}."
    )
    L.append(
        f"{meta['reps']} reps x {meta['n']} same-key cycles (and {meta['n']} extends) per lock, "
        f"rotating order; TTL {meta['ttl_s']:g} s; loadavg {meta['loadavg_start']} -> "
        f"{meta['loadavg_end']}; {meta['duration_s']:.0f} s. redis-py PING median {ping:.0f} us."
    )
    L.append("")
    L.append("### Acquire + release (same key)")
    L.append("")
    L.append("| lock | nodes | fencing | us/cycle | cycles/s | p50 us | p99 us | x redis-py "
             "| per-rep x | in PINGs | pottery / this |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, s in summ.items():
        c = s["cycle"]
        pot = summ.get(f"pottery-{s['n_nodes']}")
        vs = f"{pot['cycle']['us'] / c['us']:.1f}x" if pot and key.startswith("celery_redlock") else ""
        lo, hi = c["x_redispy_per_rep"]
        L.append(f"| {s['label']} | {s['n_nodes']} | {_fence_txt(s['fencing'])} | {c['us']:.0f} "
                 f"| {c['per_s']:.0f} | {c['p50_us']:.0f} | {c['p99_us']:.0f} | **{c['x_redispy']:.2f}** "
                 f"| {lo:.2f}-{hi:.2f} | {c['us'] / ping:.1f} | {vs} |")
    L.append("")
    L.append("### Extend (reset to the full TTL)")
    L.append("")
    L.append("| lock | nodes | fencing | us/extend | extends/s | p50 us | p99 us "
             "| x redis-py Lock.extend | per-rep x |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for key, s in summ.items():
        e = s["extend"]
        lo, hi = e["x_redispy_per_rep"]
        L.append(f"| {s['label']} | {s['n_nodes']} | {_fence_txt(s['fencing'])} | {e['us']:.0f} "
                 f"| {e['per_s']:.0f} | {e['p50_us']:.0f} | {e['p99_us']:.0f} | **{e['x_redispy']:.2f}** "
                 f"| {lo:.2f}-{hi:.2f} |")
    L.append("")
    L.append("### Targets")
    L.append("")
    L.append("| target | measured | per-rep range | reps passing | result |")
    L.append("|---|---|---|---|---|")
    for t in targets:
        unit = "x" if t["op"] == "max" else "x faster"
        L.append(f"| {t['target']} | {t['value']:.2f}{unit} | {min(t['per_rep']):.2f}-{max(t['per_rep']):.2f} "
                 f"| {t['reps_passing']}/{len(t['per_rep'])} | {'PASS' if t['pass'] else '**FAIL**'} |")
    L.append("")
    L.append("Result is judged on the median figures; \"reps passing\" shows how firm it is on this machine.")
    return "\n".join(L) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7, help="repetitions (default 7)")
    ap.add_argument("--n", type=int, default=1000, help="cycles and extends per lock per rep (default 1000)")
    ap.add_argument("--quick", action="store_true", help="3 reps x 200: about 20-25 s")
    ap.add_argument("--json", metavar="PATH", help="save raw data (every sample) and the summary here")
    ap.add_argument("--md", metavar="PATH", help="also write the Markdown report here")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 if a target fails")
    a = ap.parse_args(argv)
    if a.quick:
        a.reps, a.n = 3, 200
    import redis

    t0 = time.monotonic()
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
        "versions": versions(), "hiredis_available": bool(redis.utils.HIREDIS_AVAILABLE),
        "loadavg_start": loadavg(), "reps": a.reps, "n": a.n, "ttl_s": _adapters.TTL,
        "n_nodes": N_NODES,
    }  # fmt: skip
    log(f"starting {N_NODES} redis-server nodes on loopback ...")
    with start_nodes(N_NODES) as nodes:
        addrs = [(HOST, node.port) for node in nodes]
        with nodes[0].client() as c:
            meta["redis_server"] = c.info("server")["redis_version"]
        meta["ports"] = [p for _, p in addrs]
        log(f"nodes up on ports {meta['ports']}; {a.reps} reps x {a.n}")
        raw = bench(addrs, a.reps, a.n)
    meta["loadavg_end"] = loadavg()
    meta["duration_s"] = time.monotonic() - t0
    summ = summarize(raw)
    targets = evaluate(raw, summ)
    md = render(meta, raw, summ, targets)
    print(md)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(md)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"meta": meta, "summary": summ, "targets": targets, "raw": raw}, fh)
        log(f"wrote {a.json}")
    return 1 if a.strict and not all(t["pass"] for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
