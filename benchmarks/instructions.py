#!/usr/bin/env python3
"""The client's instructions per lock cycle, counted by callgrind: a figure that holds
still on a busy machine, for telling whether a change made the lock cost more.

``locks.py`` times the cycle, and on a shared 2-core machine its figures move by
10 % from run to run: as much as a change of the library's Python. Here
``valgrind --tool=callgrind`` counts the instructions the client process
executes (user space: the Python of the library, redis-py and the interpreter;
not the kernel's share of a syscall, not the nodes' work) for one
``Redlock.acquire`` + ``release`` of a 3-node fenced lock, the same key each
time, as ``locks.py``'s cycle. Two runs of different lengths are subtracted,
so start-up and imports cancel out; ``PYTHONHASHSEED=0`` keeps dict layouts
alike, and the median of the repetitions is reported. ``--nodes`` counts the
same cycle on other lock nodes (a PostgreSQL or an etcd node, by URL) instead
of 3 Redis masters of its own.

Each revision given is checked out in a temporary worktree and imported from
there, so commits are compared on the same nodes in one run. With none, the
checkout this script is in is measured.

Usage::

    python benchmarks/instructions.py                      # this checkout
    python benchmarks/instructions.py 8582a6e HEAD         # two commits
    python benchmarks/instructions.py --reps 5 HEAD~3 .    # "." is the working tree
    python benchmarks/instructions.py --nodes postgresql://postgres@127.0.0.1/bench e66c69f HEAD

Needs ``valgrind`` on ``PATH`` (Debian: ``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from celery_redlock.testing import RedisNodes  # noqa: E402

#: The cycle, run in a child under callgrind from the tree on its PYTHONPATH.
CYCLE = """
import sys
import celery_redlock
from celery_redlock.redlock import Redlock
assert celery_redlock.__file__.startswith(sys.argv[1]), celery_redlock.__file__
rl = Redlock(sys.argv[2].split(","), node_timeout=2.0)  # valgrind slows the client down
for _ in range(int(sys.argv[3])):
    lease = rl.acquire("instructions", ttl=10)
    assert lease is not None
    rl.release(lease)
"""


def instructions(tree: str, urls: list[str], cycles: int) -> int:
    """Instructions of one child process running ``cycles`` cycles from ``tree``."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": tree,
        "PYTHONHASHSEED": "0",
    }
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    argv += ["-c", CYCLE, tree, ",".join(urls), str(cycles)]
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or not found:
        raise SystemExit(f"the cycle failed under valgrind in {tree}:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_cycle(tree: str, urls: list[str], reps: int, short: int = 200, long: int = 1200) -> float:
    """The median over ``reps`` of (long run - short run) / (long - short) instructions."""
    instructions(tree, urls, 1)  # a fresh worktree compiles its modules: not in the figure
    counts = []
    for _ in range(reps):
        short_run = instructions(tree, urls, short)
        counts.append((instructions(tree, urls, long) - short_run) / (long - short))
    return statistics.median(counts)


@contextlib.contextmanager
def worktrees(revs: list[str]) -> Iterator[dict[str, str]]:
    """Each revision checked out in a temporary worktree ("." is this checkout's
    working tree): revision -> its tree's path (ending in a separator); removed after."""
    scratch = tempfile.mkdtemp(prefix="crl-revs-")
    trees: dict[str, str] = {}
    try:
        for rev in revs:
            if rev == ".":
                trees[rev] = ROOT + os.sep
                continue
            tree = os.path.join(scratch, re.sub(r"\W", "_", rev))
            subprocess.run(
                ["git", "-C", ROOT, "worktree", "add", "-q", "--detach", tree, rev], check=True
            )
            trees[rev] = tree + os.sep
        yield trees
    finally:
        for rev, tree in trees.items():
            if rev != ".":
                subprocess.run(
                    ["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False
                )
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("revs", nargs="*", help="commits to compare ('.' is the working tree)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per revision (default 3)")
    ap.add_argument(
        "--nodes", metavar="URL,...", help="lock nodes to count on (default: 3 Redis masters)"
    )
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH (Debian: apt-get install valgrind)")
    with worktrees(args.revs or ["."]) as trees, contextlib.ExitStack() as stack:
        urls = args.nodes.split(",") if args.nodes else []
        urls = urls or list(stack.enter_context(RedisNodes(3)).urls)
        what = f"{len(urls)}-node" if args.nodes else "3-node"
        for rev, tree in trees.items():
            count = per_cycle(tree, urls, args.reps)
            print(f"{rev}: {count / 1000:.1f} k instructions per {what} fenced cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
