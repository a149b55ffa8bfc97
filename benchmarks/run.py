#!/usr/bin/env python3
"""Entry point for ``tox -e bench``: runs the lock benchmark (``locks.py``).

All arguments are passed on, e.g. ``tox -e bench -- --quick`` or
``python benchmarks/run.py --json results.json``. See ``benchmarks/README.rst``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import locks  # noqa: E402  (benchmarks/locks.py, next to this file)

if __name__ == "__main__":
    sys.exit(locks.main(sys.argv[1:]))
