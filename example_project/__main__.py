"""Run the example: ``python -m example_project``.

Starts a broker node and three Redlock nodes (real redis-server processes on
free loopback ports), a prefork worker and two beats, then shows each feature
and checks what happened. Exits 0 when every check holds.

``python -m example_project --nodes postgresql`` (or ``EXAMPLE_NODES=postgresql``)
takes the locks on one PostgreSQL server instead, started from the
distribution's binaries (``initdb``, ``postgres``) on a free loopback port;
the broker, the results and the tasks' journal stay on the redis-server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from celery_redlock.testing import RedisNode, RedisNodes

HERE = Path(__file__).resolve().parent


#: The kinds of lock node the example runs on (``--nodes``, ``EXAMPLE_NODES``).
KINDS = ("redis", "postgresql")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_project", description=__doc__)
    parser.add_argument(
        "--nodes",
        choices=KINDS,
        default=os.environ.get("EXAMPLE_NODES", "redis"),
        help="where the locks live: three redis-server nodes (default), or one PostgreSQL "
        "server (default: $EXAMPLE_NODES)",
    )
    kind = parser.parse_args(argv).nodes
    if kind not in KINDS:
        parser.error(f"EXAMPLE_NODES={kind!r}: choose one of {', '.join(KINDS)}")
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="redlock-example-")))
        broker = stack.enter_context(RedisNode())
        urls, nodes = _lock_nodes(stack, kind)
        os.environ.update(
            EXAMPLE_BROKER_URL=f"{broker.url[:-1]}0",
            EXAMPLE_RESULT_URL=f"{broker.url[:-1]}1",
            EXAMPLE_JOURNAL_URL=f"{broker.url[:-1]}3",
            EXAMPLE_REDLOCK_NODES=",".join(urls),
        )
        if kind == "postgresql":  # a call is a commit: the PostgreSQL page's advice
            os.environ["EXAMPLE_NODE_TIMEOUT"] = "0.5"
        print(f"broker {broker.url}; Redlock nodes {', '.join(urls)}")

        from . import tasks  # after the environment is set: the app reads it
        from .app import app

        worker = _start(
            stack,
            workdir,
            "worker",
            [
                "worker",
                "-P",
                "prefork",
                "-c",
                "4",
                "-l",
                "info",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
            ],
        )
        _wait_ready(app, worker, workdir / "worker.log")
        for i in (1, 2):
            _start(
                stack,
                workdir,
                f"beat{i}",
                [
                    "beat",
                    "-S",
                    "celery_redlock.beat:RedlockScheduler",
                    "-s",
                    str(workdir / f"beat{i}-schedule"),
                    "-l",
                    "info",
                ],
            )
            time.sleep(0.7)  # started at different moments, on purpose

        checks: list[tuple[str, bool, str]] = []
        checks += demo_settle(tasks)
        checks += demo_ship(tasks)
        checks += demo_heartbeat(tasks)
        checks += demo_shared_name(tasks)
        checks += demo_enqueue(tasks)
        checks += demo_debounce(tasks)
        checks += demo_throttle(tasks)
        checks += demo_rate(tasks)
        checks += demo_beat(tasks)
        # last: a lone PostgreSQL node's crash stops every lock (the beats' too) meanwhile
        checks += demo_node_down(tasks, nodes) if kind == "redis" else demo_crash(tasks, nodes)

        print()
        width = max(len(name) for name, _, _ in checks)
        for name, ok, detail in checks:
            print(f"{'ok  ' if ok else 'FAIL'} {name:<{width}}  {detail}")
        failed = [name for name, ok, _ in checks if not ok]
        print(
            f"\n{len(checks) - len(failed)} of {len(checks)} checks hold"
            + (f"; failed: {failed}" if failed else "")
        )
        return 1 if failed else 0


def _lock_nodes(stack: ExitStack, kind: str) -> tuple[list[str], Any]:
    """The lock nodes' URLs, and three redis-server nodes or one PostgreSQL server."""
    if kind == "redis":
        nodes = stack.enter_context(RedisNodes(3))
        return nodes.urls, nodes
    from celery_redlock.testing.postgres import PostgresServer, postgres_missing

    missing = postgres_missing()
    if missing is not None:
        raise SystemExit(f"--nodes postgresql: {missing}")
    server = PostgresServer()
    stack.callback(server.close)
    return [server.url], server


def journal(tasks, kind: str) -> list[dict]:
    return [
        r
        for r in (json.loads(x) for x in tasks.journal().lrange("journal", 0, -1))
        if r["kind"] == kind
    ]


def no_overlap(records: list[dict]) -> bool:
    spans = sorted((r["start"], r["end"]) for r in records)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def demo_settle(tasks) -> list:
    print("settle: 5 payments on each of two accounts at once, lock_on_duplicate='retry'")
    results = [tasks.settle.delay(account, 10) for _ in range(5) for account in (1, 2)]
    for r in results:
        r.get(timeout=60)
    out = []
    for account in (1, 2):
        runs = [r for r in journal(tasks, "settle") if r["account_id"] == account]
        tokens = [r["token"] for r in sorted(runs, key=lambda r: r["start"])]
        out.append((f"settle account {account}: all 5 ran", len(runs) == 5, f"{len(runs)} runs"))
        out.append((f"settle account {account}: never overlapped", no_overlap(runs), ""))
        out.append(
            (
                f"settle account {account}: tokens grow, writes accepted",
                tokens == sorted(set(tokens)) and all(r["accepted"] for r in runs),
                f"tokens {tokens[0]}..{tokens[-1]}",
            )
        )
    return out


def demo_ship(tasks) -> list:
    from celery.exceptions import TaskRevokedError

    print("ship: three orders of one customer at once (dropped), one of another (runs alongside)")
    same = [tasks.ship.delay({"id": n, "customer": {"id": 7}}) for n in range(3)]
    other = tasks.ship.delay({"id": 9, "customer": {"id": 8}})
    dropped = 0
    for r in same:
        try:
            r.get(timeout=30)
        except TaskRevokedError:
            dropped += 1
    other.get(timeout=30)
    runs = journal(tasks, "ship")
    parallel = len(runs) == 2 and not no_overlap(runs)
    return [
        ("ship: one run per customer, duplicates dropped", dropped == 2, f"{dropped} dropped"),
        ("ship: other customers run in parallel", parallel, ""),
    ]


def demo_heartbeat(tasks) -> list:
    from celery.exceptions import TaskRevokedError

    print("long_import: runs 3 s with a 1 s TTL; a duplicate 1.5 s in is dropped")
    first = tasks.long_import.delay()
    time.sleep(1.5)
    second = tasks.long_import.delay()
    try:
        second.get(timeout=30)
        dropped = False
    except TaskRevokedError:
        dropped = True
    first.get(timeout=30)
    runs = journal(tasks, "long_import")
    return [
        ("heartbeat: lease kept past its TTL", len(runs) == 1 and runs[0]["lost"] is False, ""),
        ("heartbeat: duplicate dropped mid-run", dropped, ""),
    ]


def demo_shared_name(tasks) -> list:
    print("reserve/restock share lock_name='inventory': same sku never at once")
    results = [
        tasks.reserve.delay("sku-1"),
        tasks.restock.delay("sku-1"),
        tasks.restock.delay("sku-1", 2),
    ]
    for r in results:
        r.get(timeout=30, propagate=False)
    runs = journal(tasks, "inventory")
    return [
        (
            "shared lock name excludes across tasks",
            no_overlap(runs) and len(runs) >= 2,
            f"{len(runs)} runs",
        )
    ]


def demo_node_down(tasks, nodes) -> list:
    print("one of three lock nodes killed: locking goes on")
    nodes.kill(2)
    started = time.monotonic()
    token = tasks.settle.delay(3, 1).get(timeout=30)
    elapsed = time.monotonic() - started
    nodes.restart(2)
    return [
        (
            "a minority of nodes down changes nothing",
            isinstance(token, int),
            f"ran in {elapsed:.2f}s",
        )
    ]


def demo_crash(tasks, server) -> list:
    print("the one PostgreSQL node crashes (immediate stop) and restarts: nothing is lost")
    before = max(r["token"] for r in journal(tasks, "settle") if r["account_id"] == 1)
    server.crash()
    started = time.monotonic()
    result = tasks.settle.delay(1, 1)  # an outage meanwhile: retried, not failed
    time.sleep(1.0)
    server.start()  # recovers every committed write: held locks and fence values
    token = result.get(timeout=60)
    elapsed = time.monotonic() - started
    (run,) = [r for r in journal(tasks, "settle") if r["token"] == token]
    return [
        (
            "a crash of the node delays the call, never loses it",
            isinstance(token, int),
            f"ran {elapsed:.2f}s after the crash",
        ),
        (
            "tokens grow across the crash: the fenced write is accepted",
            token > before and bool(run["accepted"]),
            f"{before} -> {token}",
        ),
    ]


def demo_enqueue(tasks) -> list:
    print("rebuild_report: lock_enqueue='until_finished': ten .delay() calls, one task")
    results = [tasks.rebuild_report.delay(42) for _ in range(10)]
    ids = {r.id for r in results}
    results[0].get(timeout=30)
    runs = journal(tasks, "rebuild_report")
    return [
        ("enqueue: every caller got the same task", len(ids) == 1, f"{len(ids)} task id(s)"),
        ("enqueue: it ran once", len(runs) == 1, f"{len(runs)} run(s)"),
    ]


def demo_debounce(tasks) -> list:
    print("reindex: lock_debounce=1 s: 8 edits over 1.4 s, then quiet")
    for edit in range(8):
        tasks.reindex.delay("products", edit=edit)
        last = time.time()
        time.sleep(0.2)
    time.sleep(2.0)
    runs = journal(tasks, "reindex")
    waited = runs[0]["start"] - last if runs else 0.0
    return [
        (
            "debounce: one run per burst, with the newest arguments",
            [r["edit"] for r in runs] == [7],
            f"{len(runs)} run(s), ran with edit {[r['edit'] for r in runs]}",
        ),
        ("debounce: it ran about 1 s after the last call", 0.8 < waited < 1.8, f"{waited:.2f}s"),
    ]


def demo_throttle(tasks) -> list:
    print("webhook: lock_throttle=1 s: 25 events over 2.5 s")
    first = time.time()
    for event in range(25):
        tasks.webhook.delay("acme", event=event)
        time.sleep(0.1)
    time.sleep(1.5)
    runs = sorted(journal(tasks, "webhook"), key=lambda r: r["start"])
    starts = [r["start"] for r in runs]
    spaced = all(b - a >= 0.95 for a, b in zip(starts, starts[1:]))
    return [
        ("throttle: the first event ran at once", bool(runs) and starts[0] - first < 0.5, ""),
        ("throttle: at most one run per second", spaced, f"{len(runs)} runs"),
        ("throttle: the last event was not lost", bool(runs) and runs[-1]["event"] == 24, ""),
    ]


def demo_rate(tasks) -> list:
    print("payment-api: 20 charges and refunds on 5 accounts at once, sharing 10 starts per second")
    results = [
        (tasks.charge if n % 3 else tasks.refund).delay(f"acct-{n % 5}", 10) for n in range(20)
    ]
    for r in results:
        r.get(timeout=30)
    starts = sorted(r["start"] for r in journal(tasks, "payment-api"))
    # actual starts may come up to a grace (0.05 s) after their slot: 10 + 1 per 1 s,
    # and at most 10 in any window 0.2 s shorter (see the manual, "Rate limits")
    most = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts) if starts else 0
    strict = max(sum(1 for t in starts if s <= t < s + 0.8) for s in starts) if starts else 0
    span = starts[-1] - starts[0] if starts else 0.0
    return [
        ("rate: every call ran (none dropped)", len(starts) == 20, f"{len(starts)} runs"),
        (
            "rate: 10 starts per second across both tasks (N + 1 with the start grace)",
            most <= 11 and strict <= 10,
            f"at most {most} in any 1 s, {strict} in any 0.8 s",
        ),
        ("rate: the limit is used, not wasted", 1.8 <= span <= 4.0, f"20 starts in {span:.2f} s"),
    ]


def demo_beat(tasks) -> list:
    print("two beats, 'tick' every second: each slot sent by one of them")
    # The beats have run since the start: wait only until the slow task ran twice.
    deadline = time.monotonic() + 30
    while len(journal(tasks, "sync")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    ticks = journal(tasks, "tick")
    syncs = journal(tasks, "sync")
    slots = [t["slot"] for t in ticks]
    unique = len(slots) == len(set(slots))
    seconds = sorted(int(float(s)) for s in set(slots))
    gapless = seconds == list(range(seconds[0], seconds[-1] + 1)) if seconds else False
    return [
        (
            "beat: each slot sent at most once (none twice)",
            bool(slots) and unique,
            f"{len(slots)} ticks, {len(set(slots))} slots",
        ),
        ("beat: no slot missed", gapless, f"slots {seconds[0]}..{seconds[-1]}" if seconds else ""),
        (
            "beat + execution lock: a slow periodic task never overlaps itself",
            len(syncs) >= 2 and no_overlap(syncs),
            f"{len(syncs)} runs of 2.5 s, the slots in between dropped",
        ),
    ]


def _start(stack: ExitStack, workdir: Path, name: str, args: list[str]) -> subprocess.Popen:
    log = open(workdir / f"{name}.log", "wb")
    stack.callback(log.close)
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "example_project.app", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=HERE.parent,
        env=os.environ.copy(),
    )
    stack.callback(_stop, proc)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(app, worker: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited:\n{log.read_text()[-3000:]}")
        if b"ready." in log.read_bytes():
            return
        time.sleep(0.2)
    raise SystemExit(f"the worker did not start in {timeout}s:\n{log.read_text()[-3000:]}")


if __name__ == "__main__":
    sys.exit(main())
