#!/usr/bin/env python3
"""What a queued key costs (``lock_on_duplicate="queue"``), on a real prefork worker.

One prefork worker (4 processes) of the test app (``tests.support.lockapp``, from
a checkout) on a Redis broker; three lock nodes. Two measures:

* **Hand-over**: ``--n`` calls of one key, each holding it ``--hold`` seconds,
  sent at once; the gap between one call's end and the next call's start, p50,
  p95 and max (ms), under ``queue`` and the same calls under ``retry``
  (``lock_retry_backoff`` 0.05 s, capped at 0.5 s, the test app's), with the
  span of the run and how many calls ran out of publish order.
* **Uncontended cost**: ``--n`` calls, each of a key of its own, one after
  another: how long ``delay()`` takes (the park and the hand-over rounds under
  ``queue``) and the time from the send to the body's start, p50 and p95 (ms),
  for a ``queue`` task beside the same task under ``drop`` (``lockapp.slow``).

::

    python benchmarks/queues.py                 # about 30 s
    python benchmarks/queues.py --runs 3 --busy 2
    python benchmarks/queues.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support import harness  # noqa: E402  (the test app, from a checkout)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def wait_ends(handle: harness.WorkerHandle, run: str, n: int, timeout: float) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ends = handle.records(run, "end")
        if len(ends) >= n:
            return ends
        time.sleep(0.1)
    raise SystemExit(f"{run}: {len(handle.records(run, 'end'))} of {n} calls ended in time")


def handover(handle: harness.WorkerHandle, task: str, n: int, hold: float) -> dict[str, Any]:
    """``n`` calls of one key at once: the gaps between one end and the next start."""
    run = harness.new_run()
    t = handle.task(task)
    for i in range(n):
        t.delay(f"bench-{run}", run, duration=hold, seq=i) if task == "queued" else t.delay(
            f"bench-{run}", run, duration=hold
        )
    ends = sorted(wait_ends(handle, run, n, 60 + n * (hold + 1.0)), key=lambda r: r["start"])
    gaps = [(b["start"] - a["end"]) * 1000 for a, b in zip(ends, ends[1:])]
    seqs = [r.get("seq") for r in ends]
    out_of_order = sum(
        1 for a, b in zip(seqs, seqs[1:]) if a is not None and b is not None and b < a
    )
    return {
        "measure": f"hand-over, {task.replace('slow_retry', 'retry').replace('queued', 'queue')}",
        "p50": pct(gaps, 0.5),
        "p95": pct(gaps, 0.95),
        "max": max(gaps),
        "span": ends[-1]["end"] - ends[0]["start"],
        "ideal": n * hold,
        "out_of_order": out_of_order if task == "queued" else None,
    }


def uncontended(handle: harness.WorkerHandle, task: str, n: int) -> dict[str, Any]:
    """``n`` calls of keys of their own, one after another: publish and send-to-start."""
    run = harness.new_run()
    t = handle.task(task)
    publish, start = [], []
    for i in range(n):
        sent = time.time()
        t.delay(f"free-{run}-{i}", run, duration=0.0)
        publish.append((time.time() - sent) * 1000)
        deadline = sent + 30
        while not handle.records(run, "start")[i:] and time.time() < deadline:
            time.sleep(0.002)
        start.append((handle.records(run, "start")[i]["start"] - sent) * 1000)
    name = {"queued": "queue", "slow": "drop"}[task]
    return {
        "measure": f"uncontended, {name}",
        "publish_p50": pct(publish, 0.5),
        "publish_p95": pct(publish, 0.95),
        "start_p50": pct(start, 0.5),
        "start_p95": pct(start, 0.95),
    }


def busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=40, help="calls per measure")
    ap.add_argument("--hold", type=float, default=0.05, help="seconds each call holds its key")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside the run")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    loops = busy_loops(a.busy)
    logdir = tempfile.mkdtemp(prefix="queues-bench-")
    results: list[dict[str, Any]] = []
    try:
        with harness.make_topology(f"bench-{harness.new_run()[:8]}") as topology:
            worker = harness.PreforkWorker("w", topology.env(0, 1), logdir, concurrency=4).start()
            try:
                handle = harness.WorkerHandle("prefork", topology.app(0, 1), topology, worker)
                print(f"load {os.getloadavg()[0]:.2f}, {a.busy} busy loops, logs in {logdir}")
                for _ in range(a.runs):
                    for task in ("queued", "slow_retry"):
                        r = handover(handle, task, a.n, a.hold)
                        results.append(r)
                        order = (
                            ""
                            if r["out_of_order"] is None
                            else f", out of order {r['out_of_order']}"
                        )
                        print(
                            f"{r['measure']:<22} gap p50 {r['p50']:7.1f} ms  p95 {r['p95']:7.1f} ms"
                            f"  max {r['max']:7.1f} ms  span {r['span']:5.2f} s"
                            f" (ideal {r['ideal']:.2f} s){order}",
                            flush=True,
                        )
                    for task in ("queued", "slow"):
                        r = uncontended(handle, task, a.n)
                        results.append(r)
                        print(
                            f"{r['measure']:<22} delay() p50 {r['publish_p50']:6.2f} ms"
                            f"  p95 {r['publish_p95']:6.2f} ms   send->start p50"
                            f" {r['start_p50']:6.1f} ms  p95 {r['start_p95']:6.1f} ms",
                            flush=True,
                        )
            finally:
                worker.stop()
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"busy": a.busy, "results": results}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
