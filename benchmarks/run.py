#!/usr/bin/env python3
"""Entry point for ``tox -e bench``: the lock benchmark (``locks.py``), the
enqueue benchmark (``enqueue.py``), a locked task call's CPU (``task_cpu.py``),
the Celery task benchmark (``celery_tasks.py``), then the share of a rate limit
the starts use (``rates.py``, from a checkout: it runs the test app).

::

    python benchmarks/run.py                        # all five, full (about 11 min)
    python benchmarks/run.py --quick                # all five, smoke runs (about 3 min)
    python benchmarks/run.py --json out.json        # out.locks.json, out.enqueue.json, ...
    python benchmarks/run.py --only celery --pools solo:1 --n 500   # one, with its own options
    tox -e bench -- --quick

Running all, only the options they share are accepted: ``--quick``,
``--reps``, ``--json PATH``, ``--md PATH`` (``.locks``, ``.enqueue``,
``.task_cpu``, ``.celery`` and ``.rates`` are put before the extension) and ``--strict``
(exit status 1 if any has a failed target). With ``--only NAME`` every other
argument goes to that script. See ``benchmarks/README.rst``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import celery_tasks  # noqa: E402  (benchmarks/celery_tasks.py, next to this file)
import enqueue  # noqa: E402  (benchmarks/enqueue.py, next to this file)
import locks  # noqa: E402  (benchmarks/locks.py, next to this file)
import rates  # noqa: E402  (benchmarks/rates.py, next to this file)
import task_cpu  # noqa: E402  (benchmarks/task_cpu.py, next to this file)

BENCHES = {
    "locks": locks.main,
    "enqueue": enqueue.main,
    "task_cpu": task_cpu.main,
    "celery": celery_tasks.main,
    "rates": rates.main,
}


def _suffixed(path: str, name: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}.{name}{ext}"


def _without_only(argv: list[str]) -> list[str]:
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--only":
            skip = True
        elif not x.startswith("--only="):
            out.append(x)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only", choices=sorted(BENCHES), help="run one benchmark, passing it every other argument"
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--md", metavar="PATH")
    ap.add_argument("--strict", action="store_true")
    a, rest = ap.parse_known_args(argv)
    if a.only:
        return BENCHES[a.only](_without_only(argv))
    if rest:
        ap.error(f"{' '.join(rest)}: options of one benchmark only; use --only {'|'.join(BENCHES)}")
    status = 0
    for name, bench_main in BENCHES.items():
        args: list[str] = []
        if a.quick:
            args.append("--quick")
        if a.reps is not None:
            args += ["--reps", str(a.reps)]
        if a.json:
            args += ["--json", _suffixed(a.json, name)]
        if a.md:
            args += ["--md", _suffixed(a.md, name)]
        if a.strict:
            args.append("--strict")
        status = max(status, bench_main(args))
    return status


if __name__ == "__main__":
    sys.exit(main())
