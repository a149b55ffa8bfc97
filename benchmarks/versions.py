#!/usr/bin/env python3
"""The uncontended lock cycle of two or more revisions of celery_redlock, in ONE process.

``locks.py`` runs one tree per process, so two revisions are timed in two runs,
minutes apart; on a shared 2-core host the host's own speed moves by 10 % or
more between them, as much as the difference asked about. Here each revision's
package is copied under a name of its own (``celery_redlock_r0``,
``celery_redlock_r1``, ...: every ``celery_redlock`` in its modules renamed),
all are imported side by side, and their ``Redlock`` clients take turns on the
same nodes in blocks of ``--block`` cycles (``acquire`` + ``release`` of one
name, fenced, as ``locks.py``'s cycle), in an order that rotates every block.
A slow moment of the host falls on every revision alike, and the figure is the
median over the blocks of each one's time **divided by the first revision's
in the same round**, with the quartiles, beside the median wall time and this
process's CPU time per cycle.

The revisions are checked out in temporary worktrees (as ``instructions.py``
does); "." is the working tree. Each revision's clients use a key prefix of
their own. ``--nodes`` times the cycle on other lock nodes (a PostgreSQL or an
etcd node, by URL) instead of 3 Redis masters started here.

Usage::

    python benchmarks/versions.py e66c69f HEAD             # the last release, then now
    python benchmarks/versions.py --rounds 100 e66c69f .
    python benchmarks/versions.py --nodes postgresql://postgres@127.0.0.1:5432/bench e66c69f HEAD
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from instructions import worktrees  # noqa: E402  (next to this file)

from celery_redlock.testing import RedisNodes  # noqa: E402

#: A name as a module says it: the package, not a longer name that starts with it.
_PACKAGE = re.compile(r"\bcelery_redlock\b")


def renamed(tree: str, name: str, into: str) -> None:
    """Copy ``tree``'s package into ``into`` as the package ``name``."""
    target = os.path.join(into, name)
    shutil.copytree(
        os.path.join(tree, "celery_redlock"),
        target,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for folder, _, files in os.walk(target):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                with open(path, "w", encoding="utf-8") as f:
                    f.write(_PACKAGE.sub(name, text))


def block(client: Any, cycles: int) -> tuple[float, float]:
    """Wall and CPU seconds per cycle over ``cycles`` cycles."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(cycles):
        client.release(client.acquire("versions", ttl=10))
    return (time.perf_counter() - wall) / cycles, (time.process_time() - cpu) / cycles


def compare(clients: dict[str, Any], rounds: int, cycles: int) -> dict[str, dict[str, float]]:
    """Each client's median wall and CPU per cycle, and its ratio to the first's."""
    for client in clients.values():
        block(client, 300)  # connections opened, scripts loaded
    revs = list(clients)
    walls: dict[str, list[float]] = {rev: [] for rev in revs}
    cpus: dict[str, list[float]] = {rev: [] for rev in revs}
    ratios: dict[str, list[float]] = {rev: [] for rev in revs}
    for n in range(rounds):
        turn = n % len(revs)
        got = {rev: block(clients[rev], cycles) for rev in revs[turn:] + revs[:turn]}
        for rev in revs:
            walls[rev].append(got[rev][0])
            cpus[rev].append(got[rev][1])
            ratios[rev].append(got[rev][0] / got[revs[0]][0])
    out = {}
    for rev in revs:
        q1, _, q3 = statistics.quantiles(ratios[rev], n=4)
        out[rev] = {
            "wall_us": statistics.median(walls[rev]) * 1e6,
            "cpu_us": statistics.median(cpus[rev]) * 1e6,
            "ratio": statistics.median(ratios[rev]),
            "q1": q1,
            "q3": q3,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("revs", nargs="+", help="revisions, the first the reference ('.': the tree)")
    ap.add_argument("--rounds", type=int, default=60, help="blocks per revision (default 60)")
    ap.add_argument("--block", type=int, default=200, help="cycles per block (default 200)")
    ap.add_argument("--nodes", metavar="URL,...", help="lock nodes (default: 3 Redis masters)")
    args = ap.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="crl-versions-")
    try:
        with worktrees(args.revs) as trees, contextlib.ExitStack() as stack:
            urls = args.nodes.split(",") if args.nodes else []
            urls = urls or list(stack.enter_context(RedisNodes(3)).urls)
            sys.path.insert(0, scratch)
            clients = {}
            for i, (rev, tree) in enumerate(trees.items()):
                name = f"celery_redlock_r{i}"
                renamed(tree, name, scratch)
                module = importlib.import_module(f"{name}.redlock")
                clients[rev] = module.Redlock(urls, key_prefix=f"crl-versions-r{i}")
            where = args.nodes or "3 Redis masters"
            print(f"{args.rounds} blocks of {args.block} fenced cycles each, on {where}:")
            for rev, row in compare(clients, args.rounds, args.block).items():
                print(
                    f"  {rev:>12}: {row['wall_us']:7.1f} us a cycle, client CPU "
                    f"{row['cpu_us']:6.1f} us; x{row['ratio']:.3f} the first "
                    f"(quartiles {row['q1']:.3f}-{row['q3']:.3f})"
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
