"""The manual builds without a warning, and its examples run as they are written.

* ``sphinx-build -W -b html``: a broken reference, a docstring that is not
  valid reStructuredText or a page left out of the table of contents fails.
* ``sphinx-build -W -b doctest``: every ``testcode`` block of the manual runs
  against real redis-server nodes (and, where a page needs one, a real worker
  in a thread; see :mod:`tests.support.docenv`), its printed output compared.
* The two files of "Testing your tasks" run as a pytest session of their own.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def sphinx_build(builder: str, out: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", builder, str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"sphinx-build -b {builder} failed:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_manual_builds_with_warnings_as_errors(tmp_path: Path):
    sphinx_build("html", tmp_path)
    pages = {path.stem for path in DOCS.glob("*.rst")}
    built = {path.stem for path in tmp_path.glob("*.html")}
    assert pages <= built, pages - built


def test_the_manual_examples_run(tmp_path: Path):
    sphinx_build("doctest", tmp_path)
    report = (tmp_path / "output.txt").read_text()
    with_examples = {p.stem for p in DOCS.glob("*.rst") if ".. testcode::" in p.read_text()}
    assert {
        "locking",
        "contention",
        "fencing",
        "enqueue",
        "bursts",
        "limits",
        "django",
        "asyncio",
    } <= with_examples
    ran = set(re.findall(r"^Document: (\S+)$", report, re.MULTILINE))
    assert with_examples <= ran, with_examples - ran
    assert re.search(r"^\s+0 failures in tests$", report, re.MULTILINE), report
    count = int(re.search(r"^\s+(\d+) tests$", report, re.MULTILINE).group(1))
    assert count >= len(with_examples), report


def example_files() -> dict[str, str]:
    """The Python blocks of "Testing your tasks", by the file name their first line gives."""
    text = (DOCS / "testing.rst").read_text()
    files = {}
    for block in re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text):
        code = "\n".join(line[4:] for line in block.splitlines()).strip() + "\n"
        name = code.splitlines()[0].removeprefix("# ").strip()
        files[name] = code
    return files


def test_the_testing_page_has_a_conftest_and_a_test_module():
    assert set(example_files()) == {"conftest.py", "test_tasks.py"}


def test_the_testing_page_example_passes(pytester: pytest.Pytester):
    for name, code in example_files().items():
        pytester.path.joinpath(name).write_text(code)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)


def test_the_readme_quickstart_runs():
    """The README's first Python block, its Redis servers mapped onto real nodes."""
    from celery.contrib.testing.worker import start_worker

    from celery_redlock.testing import RedisNodes

    readme = (ROOT / "README.rst").read_text()
    block = re.search(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", readme).group(1)
    code = "\n".join(line[4:] for line in block.splitlines())
    servers = sorted(set(re.findall(r"redis://([\w.-]+:\d+)", code)))
    assert servers, code
    writes = []

    class Database:
        def execute(self, sql: str, **params: object) -> None:
            writes.append(params)

    with RedisNodes(len(servers)) as nodes:
        for server, node in zip(servers, nodes):
            code = code.replace(f"redis://{server}/", f"{node.url.rsplit('/', 1)[0]}/")
        namespace: dict = {"db": Database()}
        exec(compile(code, "README.rst", "exec"), namespace)
        app, settle = namespace["app"], namespace["settle"]
        app.conf.worker_hijack_root_logger = False  # as Celery's fixtures do
        # start_worker sets the root logger's level; later tests' log capture needs it back.
        root_level = logging.getLogger().level
        try:
            with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
                settle.delay(1, 5)
                settle.delay(2, 5)
                deadline = time.monotonic() + 60
                while len(writes) < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
        finally:
            logging.getLogger().setLevel(root_level)
    assert sorted(w["id"] for w in writes) == [1, 2], writes
    assert all(isinstance(w["token"], int) and w["token"] > 0 for w in writes), writes


def quickstart(page: str) -> tuple[dict[str, str], list[str], str]:
    """The files (Python blocks named by their first line), the shell commands
    (``$`` lines) and the printed output (the text block) of a quickstart page."""
    text = (DOCS / page).read_text()
    blocks = re.findall(r"\.\. code-block:: (\w+)\n\n((?:    .*\n|\n)+)", text)
    files, commands, output = {}, [], ""
    for language, block in blocks:
        body = "\n".join(line[4:] for line in block.splitlines()).strip() + "\n"
        if language == "python":
            files[body.splitlines()[0].removeprefix("# ").strip()] = body
        elif language == "console":
            commands += [line[2:] for line in body.splitlines() if line.startswith("$ ")]
        elif language == "text":
            output = body
    return files, commands, output


def test_the_without_redis_quickstart_runs_as_written(tmp_path: Path):
    """The page's files and commands, on RabbitMQ and a PostgreSQL server of the
    tests: its ``localhost`` URLs mapped onto them, and a queue of its own."""
    import os
    import shlex
    import signal
    import uuid

    from celery import Celery

    from tests.support import brokers, postgres

    postgres.require(postgres.unreachable())
    amqp = brokers.require_amqp()
    files, commands, expected = quickstart("without-redis.rst")
    assert set(files) == {"proj.py", "setup_db.py", "try_it.py"}, files
    assert expected.strip(), "the page shows what try_it.py prints"
    host, port = postgres.address()
    queue = f"without-redis-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    with postgres.throwaway_database() as database:
        for name, code in files.items():
            code = code.replace("app@localhost:5432/shop", f"postgres@{host}:{port}/{database}")
            code = code.replace("amqp://guest:guest@localhost:5672//", amqp)
            if name == "proj.py":  # other tests share the broker: a queue of its own
                code += f"\napp.conf.task_default_queue = {queue!r}\n"
            (tmp_path / name).write_text(code)
        worker, printed = None, ""
        try:
            for command in commands:
                args = shlex.split(command)
                args = [sys.executable, *args[1:]] if args[0] == "python" else args
                args = [sys.executable, "-m", "celery", *args[1:]] if args[0] == "celery" else args
                if "worker" in args:  # in the background, until the calls are done
                    log = tmp_path / "worker.log"
                    worker = subprocess.Popen(
                        args, cwd=tmp_path, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
                    )
                    deadline = time.monotonic() + 60
                    while b"ready." not in log.read_bytes():
                        assert worker.poll() is None, log.read_text()[-3000:]
                        assert time.monotonic() < deadline, log.read_text()[-3000:]
                        time.sleep(0.2)
                    continue
                done = subprocess.run(
                    args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
                )
                assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
                if command == "celery -A proj redlock nodes":
                    assert f"postgresql://postgres@{host}:{port}/{database}" in done.stdout
                printed = done.stdout
        finally:
            if worker is not None:
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
            brokers.delete(Celery(broker=amqp, set_as_current=False), queue)
    assert worker is not None and commands[-1] == "python try_it.py", commands
    assert printed == expected, printed
