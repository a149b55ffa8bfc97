"""Run Celery's own integration suite plain and with every task a LockedTask.

Usage: ``python tests/celery_suite/run.py [--config plain|wait|limit64 ...]
[--timeout SECONDS] [--cache DIR] [-- PYTEST_ARGS...]``; see the package
docstring for what each configuration means.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import celery_redlock
from celery_redlock.testing import RedisNodes

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim"
DEFAULT_CACHE = HERE.parents[1] / ".tox" / "celery-suite"

SUITE_FILES = (
    "t/integration/test_tasks.py",
    "t/integration/test_canvas.py",
    "t/integration/test_inspect.py",
)

#: Configuration name -> the shim's settings (None: plain Celery, no shim).
CONFIGS: dict[str, dict | None] = {
    "plain": None,
    "wait": {"redlock_on_duplicate": "wait"},
    "limit64": {"redlock_limit": 64},
}

#: Tests allowed to fail with the plugin although they pass plain, each with the
#: reason the lock itself gives. Empty: every plain pass must pass with the plugin.
EXPECTED_DIFFERENCES: dict[str, str] = {}

LOCK_NODES = 3

# Run with the suite's environment before each run: the shim is on (or off) for a
# fresh app, Celery's built-in tasks included.
PROBE = """
import sys
from celery import Celery
from celery_redlock import LockedTask
app = Celery("probe")
app.finalize()
locked = {n: isinstance(t, LockedTask) for n, t in app.tasks.items()}
want = sys.argv[1] == "True"
assert set(locked.values()) == {want}, locked
print(f"{len(locked)} built-in tasks, LockedTask: {want}")
"""


def celery_version() -> str:
    return metadata.version("celery")


def download_sdist(version: str, cache: Path) -> Path:
    """Fetch celery-<version>.tar.gz from PyPI's JSON API, checked against its sha256."""
    index = "https://pypi.org/pypi/celery/json"
    with urllib.request.urlopen(index, timeout=60) as r:
        files = json.load(r)["releases"][version]
    (sdist,) = (f for f in files if f["packagetype"] == "sdist")
    target = cache / sdist["filename"]
    if target.exists() and _sha256(target) == sdist["digests"]["sha256"]:
        return target
    partial = target.with_suffix(".part")
    url = urllib.parse.urljoin(index, sdist["url"])  # a mirror may give it relative
    with urllib.request.urlopen(url, timeout=300) as r, open(partial, "wb") as out:
        shutil.copyfileobj(r, out)
    if _sha256(partial) != sdist["digests"]["sha256"]:
        partial.unlink()
        raise SystemExit(f"{url}: sha256 does not match PyPI's")
    partial.replace(target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack_suite(sdist: Path, dest: Path) -> Path:
    """Unpack only ``t/`` and ``pyproject.toml`` (its pytest settings).

    The sdist's ``celery/`` package stays out: on ``sys.path`` it would shadow the
    installed Celery that the plugin runs with.
    """
    if (dest / "t" / "integration" / "conftest.py").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)  # a half-unpacked folder of an earlier run
    staging = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            if rest == "pyproject.toml" or rest.startswith("t/"):
                member.name = rest
                members.append(member)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(staging, members=members, filter="data")
        else:  # Python without extraction filters; members are regular files only
            tar.extractall(staging, members=[m for m in members if m.isfile() or m.isdir()])
    staging.rename(dest)
    return dest


def _import_path() -> list[str]:
    """The folder this celery_redlock comes from, unless the interpreter has it anyway."""
    root = str(Path(celery_redlock.__file__).resolve().parents[1])
    installed = {str(Path(p).resolve()) for p in site.getsitepackages()}
    return [] if root in installed else [root]


OUTCOMES = ("passed", "failed", "skipped", "xfailed")


def outcomes(junit: Path) -> dict[str, str]:
    """Map each test id to one of OUTCOMES.

    A test rerun by ``flaky`` has one entry per attempt (a failed attempt shows as
    an empty one); the last counts. An unexpected pass of an ``xfail`` test is a
    pass, as in the junit file.
    """
    found: dict[str, str] = {}
    for case in ET.parse(junit).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            found[test] = "failed"
        elif skipped is not None:
            found[test] = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            found[test] = "passed"
    return found


def run_config(name: str, suite: Path, out: Path, timeout: float, pytest_args: list[str]) -> dict:
    settings = CONFIGS[name]
    junit = out / f"{name}.xml"
    junit.unlink(missing_ok=True)
    # Fresh servers per configuration: no receipt, fence or queue outlives a run.
    with RedisNodes(1 + LOCK_NODES) as nodes:
        broker, locks = nodes[0], nodes.urls[1:]
        env = dict(os.environ)
        env.pop("CELERY_REDLOCK_SUITE_SETTINGS", None)
        path = _import_path()
        if settings is not None:
            path.insert(0, str(SHIM))
            env["CELERY_REDLOCK_SUITE_SETTINGS"] = json.dumps({"redlock_nodes": locks, **settings})
        env["PYTHONPATH"] = os.pathsep.join([*path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(
            TEST_BROKER=broker.url,
            TEST_BACKEND=broker.url,
            REDIS_HOST=broker.host,
            REDIS_PORT=str(broker.port),
        )
        command = [
            sys.executable, "-m", "pytest", *SUITE_FILES,
            "--rootdir", str(suite), "-p", "no:cacheprovider", f"--timeout={timeout:g}",
            "-q", "-rfE", f"--junitxml={junit}", *pytest_args,
        ]  # fmt: skip
        print(f"\n=== celery-suite [{name}] {settings or 'plain Celery'}", flush=True)
        probe = [sys.executable, "-c", PROBE, str(settings is not None)]
        subprocess.run(probe, env=env, check=True)
        started = time.monotonic()
        code = subprocess.call(command, cwd=suite, env=env)
        duration = time.monotonic() - started
        fences = sum(len(keys) for keys in RedisNodes(nodes=nodes[1:]).keys("*fence*").values())
    if settings is not None and not fences:
        raise SystemExit(f"[{name}]: no task took a lock (no fence key on the lock nodes)")
    found = outcomes(junit) if junit.exists() else {}
    counts = {k: sum(1 for v in found.values() if v == k) for k in OUTCOMES}
    return {
        "name": name,
        "exit": code,
        "duration": round(duration),
        "fence_keys": fences,
        **counts,
        "tests": found,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", choices=list(CONFIGS))
    parser.add_argument("--timeout", type=float, default=180, help="per test, in seconds")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = parser.parse_args(argv)
    # A TERM (a CI job cancelled) unwinds like Ctrl-C: pytest is stopped and the
    # servers this run started are stopped by pid on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    configs = args.config or list(CONFIGS)

    version = celery_version()
    args.cache.mkdir(parents=True, exist_ok=True)
    suite = unpack_suite(download_sdist(version, args.cache), args.cache / f"celery-{version}")
    out = args.cache / "results"
    out.mkdir(exist_ok=True)

    runs = [run_config(n, suite, out, args.timeout, args.pytest_args) for n in configs]

    print(f"\n=== celery-suite: Celery {version}, {', '.join(SUITE_FILES)}")
    for run in runs:
        counts = ", ".join(f"{run[k]} {k}" for k in OUTCOMES)
        print(f"{run['name']:>8}: {counts} in {run['duration']} s (pytest exit {run['exit']})")
    broken = [r["name"] for r in runs if r["exit"] not in (0, 1)]
    regressions = 0
    plain = next((r for r in runs if r["name"] == "plain"), None)
    for run in runs:
        if plain is None or run is plain:
            continue
        lost = sorted(
            test
            for test, outcome in plain["tests"].items()
            if outcome == "passed" and run["tests"].get(test) != "passed"
        )
        print(f"passed plain, not with {run['name']}: {len(lost)}")
        for test in lost:
            reason = EXPECTED_DIFFERENCES.get(test)
            print(f"    {test}" + (f"  (expected: {reason})" if reason else ""))
            regressions += reason is None
    (out / "summary.json").write_text(json.dumps(runs, indent=1, sort_keys=True))
    if broken:
        print(f"runs that broke off: {', '.join(broken)}")
    if plain is None:  # nothing to compare with: the runs' own failures decide
        regressions = sum(r["failed"] for r in runs)
    return 1 if broken or regressions else 0


if __name__ == "__main__":
    sys.exit(main())
