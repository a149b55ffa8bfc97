#!/usr/bin/env python3
"""How much of a rate limit the starts use, on real prefork workers.

Two prefork workers (4 processes each) of the test app
(``tests.support.lockapp``, from a checkout) consume one Redis broker; three
lock nodes. Producer processes (4 by default) send ``--n`` calls of one rated
key at once; meanwhile an unrated task is sent every second (the probe). Per
scenario it reports:

* ``span``: first start to last; ``share``: the starts per second over the
  span against N (``(n - 1) / span / N``, 100 % when every slot is used);
* ``most/P``: the most starts in any window of the period (bound: N + 1 with
  burst 1), ``most/P-g-d``: in any window shorter by the grace and 20 ms
  (bound: N);
* ``late``: how long after its booked instant a start began (p50 and max, ms;
  the grace plus the run lock's round), ``re-pub``: messages the rate
  re-published (a delivery too late for its booking, an outage, split nodes;
  a call booked at publish is sent once);
* ``bounced``: re-publishes on the lock's retry backoff (a start that met the
  key held and booked nothing), ``probe``: the longest wait of the unrated
  task for a worker (s), ``once``: no call ran twice (``starts`` says how
  many ran before the run's deadline, twice the ideal span plus 30 s).

Scenarios: ``10/s``, ``100/s``, ``10/s+500/h`` (two windows: 10/s paces, the hour counts),
``shared``
(two tasks of distinct keys, one ``lock_also`` rate of 10/s), and
``--ladder`` rates (one key, 200, 400, 800/s by default) to find where the
workers themselves become the limit: the share falls once a start costs the
pool more than 1/N of its time.

::

    python benchmarks/rates.py                      # every scenario once, about 2 min
    python benchmarks/rates.py --only 10/s --runs 3 # three runs in a row
    python benchmarks/rates.py --busy 2             # beside two busy loops
    python benchmarks/rates.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support import harness  # noqa: E402  (the test app, from a checkout)
from tests.support.windows import most_in_window  # noqa: E402

#: Scenario: (label, task, the call's rate argument or None, N per period, period, calls).
SCENARIOS = {
    "10/s": ("rated_at", "10/s", 10, 1.0, 200),
    "100/s": ("rated_at", "100/s", 100, 1.0, 1000),
    # two windows: 10/s paces, the hour counts (200 starts leave it 300 to go), so
    # the share and the window counts are the 10/s window's
    "10/s+500/h": ("rated_at", ["10/s", "500/h"], 10, 1.0, 200),
    "shared": ("rate_also", None, 10, 1.0, 200),
}
RETRY = re.compile(r"\] retry: (.*)$")


def calls_of(task: str, rate: Any, run: str, n: int) -> list[tuple[str, str, dict]]:
    """The scenario's calls: one key (its own per run, so runs share no schedule), or,
    for ``shared``, two tasks of many keys booking one ``lock_also`` rate."""
    if task == "rate_also":
        return [(f"rate_also_{'ab'[i % 2]}", f"{run}-{i % 20}", {"run": run}) for i in range(n)]
    # a body of 0 s: the key's own lock serialises its starts, so at 100/s and more
    # a body of T or longer would make the lock, not the rate, the limit
    return [(task, run, {"run": run, "rate": rate, "duration": 0.0}) for _ in range(n)]


def log_offsets(workers: list[harness.PreforkWorker]) -> list[int]:
    return [os.path.getsize(w.logfile) for w in workers]


def republished(workers: list[harness.PreforkWorker], since: list[int]) -> dict[str, int]:
    """The run's re-publishes by reason, from the workers' logs."""
    out = {"rate": 0, "bounced": 0}
    for worker, offset in zip(workers, since):
        with open(worker.logfile, errors="replace") as log:
            log.seek(offset)
            for line in log:
                match = RETRY.search(line.rstrip())
                if not match:
                    continue
                reason = match.group(1)
                if reason.startswith("rate:"):
                    out["rate"] += 1
                elif reason.startswith("lock "):
                    out["bounced"] += 1
    return out


def scenario(
    handle: harness.WorkerHandle,
    workers: list[harness.PreforkWorker],
    label: str,
    task: str,
    rate: Any,
    n_per: int,
    period: float,
    n: int,
    producers: int,
) -> dict[str, Any]:
    """One run of ``n`` calls from ``producers`` processes, with the probe."""
    topology = handle.topology
    run, probe_run = harness.new_run(), harness.new_run()
    calls = calls_of(task, rate, run, n)
    since = log_offsets(workers)
    procs = harness.senders(topology, calls, producers)
    interval = period / n_per
    deadline = time.time() + n * interval * 2 + 30
    sent: dict[str, float] = {}
    while len(handle.records(run, "start")) < n and time.time() < deadline:
        time.sleep(1.0)
        sent_at = time.time()
        result = handle.task("slow").delay(f"probe-{len(sent)}", probe_run, duration=0.0)
        sent[result.id] = sent_at
    for p in procs:
        p.join(60)
    time.sleep(0.5)  # a start that ran twice would show by now
    records = handle.records(run, "start")
    starts = [r["start"] for r in records]
    # the calls left over (a scenario past its deadline) run before the next one starts
    harness.wait_for(lambda: len(handle.records(run, "start")) >= n, 600, "the rest", 1.0)
    harness.wait_for(lambda: len(handle.records(probe_run, "start")) >= len(sent), 30, "probes")
    probes = {r["id"]: r["start"] for r in handle.records(probe_run, "start")}
    waits = [probes[i] - sent[i] for i in sent if i in probes]
    late = sorted(r["start"] - r["booked"] for r in records if r.get("booked") is not None)
    span = max(starts) - min(starts) if len(starts) > 1 else 0.0
    grace = min(interval / 2, 0.25)
    counts = republished(workers, since)
    return {
        "scenario": label,
        "n": n,
        "starts": len(starts),
        "once": len({r["id"] for r in records}) == len(records),  # none ran twice
        "span": span,
        "ideal": (n - 1) * interval,
        "share": (n - 1) / span / (n_per / period) if span else 0.0,
        "most_period": most_in_window(starts, period),
        "most_short": most_in_window(starts, period - grace - 0.02),
        "bound": n_per,
        "late_p50_ms": 1000 * statistics.median(late) if late else 0.0,
        "late_max_ms": 1000 * max(late) if late else 0.0,
        "republished": counts["rate"],
        "bounced": counts["bounced"],
        "probe_max": max(waits) if waits else 0.0,
        "probes": len(waits),
        "records": sorted((r["start"], r.get("booked")) for r in records),
    }


def busy_loops(count: int) -> list[subprocess.Popen]:
    """``count`` shell loops that keep a core busy each."""
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(count)]


def row(r: dict[str, Any]) -> str:
    return (
        f"{r['scenario']:<14} {r['starts']:>5}/{r['n']:<5} {r['span']:7.2f} {r['ideal']:7.2f} "
        f"{100 * r['share']:6.1f}% {r['most_period']:>4}/{r['bound'] + 1:<4} "
        f"{r['most_short']:>4}/{r['bound']:<4} {r['late_p50_ms']:6.1f} {r['late_max_ms']:7.1f} "
        f"{r['republished']:>6} {r['bounced']:>6} {r['probe_max']:6.2f} "
        f"{'yes' if r['once'] else 'NO':>4}"
    )


HEADER = (
    f"{'scenario':<14} {'starts':>11} {'span s':>7} {'ideal':>7} {'share':>7} {'most/P':>9} "
    f"{'most/P-g-d':>9} {'late50':>6} {'latemax':>7} {'re-pub':>6} {'bounce':>6} "
    f"{'probe':>6} {'once':>4}"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="a scenario")
    ap.add_argument("--runs", "--reps", type=int, default=1, help="runs of each scenario in a row")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument(
        "--ladder",
        type=int,
        nargs="*",
        default=None,
        metavar="N",
        help="one key at N/s for each N (default 200 400 800), 2 s of calls each",
    )
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside the run")
    ap.add_argument("--quick", action="store_true", help="10/s and one ladder step")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--md", metavar="PATH", help="the table, as text")
    ap.add_argument("--strict", action="store_true", help="exit status 1 if a target fails")
    a = ap.parse_args(argv)
    chosen = a.only or (["10/s"] if a.quick else list(SCENARIOS))
    ladder = a.ladder if a.ladder is not None else ([400] if a.quick else [200, 400, 800])
    results: list[dict[str, Any]] = []
    loops = busy_loops(a.busy)
    logdir = tempfile.mkdtemp(prefix="rates-bench-")
    try:
        with harness.make_topology(f"bench-{harness.new_run()[:8]}") as topology:
            env = topology.env(0, 1)
            workers = [
                harness.PreforkWorker(f"w{i}", env, logdir, concurrency=4).launch()
                for i in range(2)
            ]
            try:
                for w in workers:
                    w.await_ready()
                handle = harness.WorkerHandle("prefork", topology.app(0, 1), topology, workers[0])
                print(
                    f"load {os.getloadavg()[0]:.2f}, {a.busy} busy loops, "
                    f"{os.cpu_count()} cores, logs in {logdir}"
                )
                print(HEADER)
                plan = [(s, *SCENARIOS[s]) for s in chosen for _ in range(a.runs)]
                plan += [(f"{n}/s", "rated_at", f"{n}/s", n, 1.0, 2 * n) for n in ladder]
                for label, task, rate, n_per, period, n in plan:
                    r = scenario(handle, workers, label, task, rate, n_per, period, n, a.producers)
                    r["load"] = os.getloadavg()[0]
                    results.append(r)
                    print(row(r), flush=True)
            finally:
                for w in workers:
                    w.stop()
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    failed = [f"{r['scenario']}: {why}" for r in results for why in missed(r)]
    for line in failed or ["every target met"]:
        print(line)
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"busy": a.busy, "results": results, "failed": failed}, out, indent=1)
    if a.md:
        with open(a.md, "w") as out:
            out.write("\n".join([HEADER, *map(row, results), *failed]) + "\n")
    return 1 if a.strict and failed else 0


def missed(r: dict[str, Any]) -> list[str]:
    """The targets of a scenario of SCENARIOS that it missed (the ladder has none: it
    shows where the workers become the limit)."""
    if r["scenario"] not in SCENARIOS:
        return []
    out = []
    if r["share"] < 0.95:
        out.append(f"used {100 * r['share']:.1f} % of the limit (target: at least 95 %)")
    if r["most_period"] > r["bound"] + 1:
        out.append(f"{r['most_period']} starts in a window of the period (bound N + 1)")
    if r["probe_max"] > 0.5:
        out.append(f"an unrated task waited {r['probe_max']:.2f} s (target: 0.5 s)")
    if not r["once"] or r["starts"] != r["n"]:
        out.append(f"{r['starts']} of {r['n']} calls ran, {'once' if r['once'] else 'some twice'}")
    return out


if __name__ == "__main__":
    sys.exit(main())
