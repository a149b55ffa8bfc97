"""A worker whose locks cannot work refuses to start; errors that cannot heal are no outage.

Real prefork workers on RabbitMQ, with no lock node at all or a PostgreSQL node:

* no ``redlock_nodes`` and a broker that is not Redis, or a node whose
  database does not exist: the worker exits non-zero before it consumes,
  naming what is wrong (the message it was sent stays in its queue);
* the node's password changed while the worker runs: each attempt says so at
  ERROR, the tasks are kept (well past ``redlock_retry_max_attempts``, which
  an outage would have spent), and they run once the password is right again.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator

import pytest

from tests.support import brokers, harness, refuseapp
from tests.support.harness import wait_for
from tests.support.postgres import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

APP = "tests.support.refuseapp"


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    from celery_redlock.testing import RedisNode

    node = RedisNode()
    try:
        yield node.url
    finally:
        node.close()


@pytest.fixture(scope="module")
def server():
    from celery_redlock.testing.postgres import PostgresServer, postgres_missing

    require(postgres_missing())
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()


def _env(backend: str, queue: str, nodes: str | None = None, **conf: object) -> dict[str, str]:
    env = {
        "CRL_BROKER_URL": brokers.require_amqp(),
        "CRL_BACKEND_URL": backend,
        "CRL_QUEUE": queue,
        "CRL_CONF": json.dumps(conf),
    }
    if nodes is not None:
        env["CRL_NODES"] = nodes
    return env


def _refused(env: dict[str, str], logdir: str, queue: str) -> tuple[int, str, int]:
    """Send one task, start a worker on its queue: (exit status, log, messages left)."""
    app = refuseapp.make_app(env, main="refuse-client")
    try:
        app.tasks["refuseapp.locked"].delay("k")
        proc = harness.PreforkWorker(queue, env, logdir, [queue], 2, app=APP).launch()
        assert proc.proc is not None
        try:
            status = proc.proc.wait(60)
        finally:
            proc.stop(now=True)
        with open(proc.logfile, errors="replace") as f:
            log = f.read()
        return status, log, brokers.queued(app, queue)
    finally:
        brokers.delete(app, queue)
        app.close()


def test_no_lock_node_and_a_rabbitmq_broker_refuses_to_start(backend, tmp_path, pytestconfig):
    harness.WORKER_LOGS.register(pytestconfig)
    queue = f"refuse-nonodes-{uuid.uuid4().hex[:8]}"
    status, log, left = _refused(_env(backend, queue), str(tmp_path), queue)
    assert status != 0, log
    assert "redlock_nodes" in log and "postgresql://" in log and "etcd://" in log, log
    assert "Redis URLs" not in log, log
    assert "ready." not in log, log  # Celery's own line once it consumes
    assert left == 1, log  # the message was not consumed


def test_a_database_that_does_not_exist_refuses_to_start(backend, server, tmp_path, pytestconfig):
    harness.WORKER_LOGS.register(pytestconfig)
    queue = f"refuse-nodb-{uuid.uuid4().hex[:8]}"
    node = f"postgresql://postgres@{server.host}:{server.port}/crl_no_such_db"
    status, log, left = _refused(_env(backend, queue, node), str(tmp_path), queue)
    assert status != 0, log
    assert 'database "crl_no_such_db" does not exist' in log, log
    assert "fix: create that database" in log, log
    assert "ready." not in log, log
    assert left == 1, log


@pytest.fixture
def password_node(server) -> Iterator[str]:
    """A role ``crl_app`` with a password, which the server checks (scram) on TCP,
    owning a database of its own: the node's URL."""
    hba = os.path.join(server.data, "pg_hba.conf")
    with open(hba) as f:
        before = f.read()
    with open(hba, "w") as f:  # first match wins: this line before the trust ones
        f.write("host all crl_app 127.0.0.1/32 scram-sha-256\n" + before)
    server.sql("SELECT pg_reload_conf()")
    server.sql("CREATE ROLE crl_app LOGIN PASSWORD 'pw-right'")
    server.sql("CREATE DATABASE crl_app OWNER crl_app")
    try:
        yield f"postgresql://crl_app:pw-right@{server.host}:{server.port}/crl_app"
    finally:
        with open(hba, "w") as f:
            f.write(before)
        server.sql("SELECT pg_reload_conf()")
        server.kill_backends()
        server.sql("DROP DATABASE IF EXISTS crl_app")
        server.sql("DROP ROLE IF EXISTS crl_app")


def test_a_password_changed_at_run_time_keeps_the_tasks(
    backend, server, password_node, tmp_path, pytestconfig
):
    harness.WORKER_LOGS.register(pytestconfig)
    queue = f"refuse-password-{uuid.uuid4().hex[:8]}"
    # One outage attempt allowed: a task handled as an outage would fail at the second.
    # The node's timeouts are generous: a connect a loaded host made late would be an outage.
    conf = {
        "redlock_retry_max_attempts": 1,
        "redlock_retry_backoff_max": 0.4,
        "redlock_node_timeout": 5.0,
        "redlock_connect_timeout": 5.0,
    }
    env = _env(backend, queue, password_node, **conf)
    app = refuseapp.make_app(env, main="refuse-client")
    proc = harness.PreforkWorker(queue, env, str(tmp_path), [queue], 2, app=APP).start()
    try:
        locked = app.tasks["refuseapp.locked"]
        assert locked.delay("first").get(timeout=30)["key"] == "first"
        server.sql("ALTER ROLE crl_app PASSWORD 'pw-changed'")
        server.kill_backends()  # the worker's open connections go: it must log in again
        results = [locked.delay(f"k{i}") for i in range(3)]

        def errors() -> list[str]:
            with open(proc.logfile, errors="replace") as f:
                return [line for line in f if "cannot be taken until a lock node is fixed" in line]

        # Each task was kept several times, past its one outage attempt.
        wait_for(lambda: all(sum(r.id in line for line in errors()) >= 3 for r in results), 60)
        for line in errors():
            assert "ERROR" in line and "password authentication failed" in line, line
            assert "crl_app:***@" in line and "pw-right" not in line, line
            assert "its retries are not spent" in line, line
        assert all(r.state in ("PENDING", "RETRY") for r in results), [r.state for r in results]

        server.sql("ALTER ROLE crl_app PASSWORD 'pw-right'")
        got = [r.get(timeout=30) for r in results]
        assert [g["key"] for g in got] == ["k0", "k1", "k2"]
        assert all(r.state == "SUCCESS" for r in results)
        with open(proc.logfile, errors="replace") as f:
            log = f.read()
        assert "lock nodes unavailable" not in log, log  # not an outage
        assert not re.search(r"giving up|raised unexpected", log), log
    finally:
        proc.stop(now=True)
        brokers.delete(app, queue)
        app.close()
