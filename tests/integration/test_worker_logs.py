"""What a real prefork worker's log says about its lock nodes.

* At start, one line names the lock nodes; without ``redlock_nodes`` it says
  that the broker's Redis is the one node (once per worker, not per child).
  A node that does not answer then is named in a WARNING, with how many more
  failures the quorum tolerates.
* During an outage of the lock nodes: one WARNING when it starts, with each
  node's error, a short line per attempt, and one INFO line when it ends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_redlock import LockedTask, signals
from celery_redlock.plan import plan_of
from celery_redlock.testing import RedisNodes, free_port
from tests.support import harness, lockapp
from tests.support.harness import Topology, WorkerHandle, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _worker(
    topology: Topology, tmp_path_factory, pytestconfig, name: str, db: int, **env: str
) -> Iterator[WorkerHandle]:
    harness.WORKER_LOGS.register(pytestconfig)
    env = dict(topology.env(db, db + 1), CRL_CONF=json.dumps({"task_default_queue": name}), **env)
    logdir = str(tmp_path_factory.mktemp(name))
    proc = harness.PreforkWorker(name, env, logdir, queues=[name], concurrency=2).start()
    app = lockapp.app_from_env(env, main=f"{name}-client")
    topology.apps.append(app)
    try:
        yield WorkerHandle("prefork", app, topology, proc)
    finally:
        proc.stop(now=True)


@pytest.fixture(scope="module")
def broker_node_worker(topology, tmp_path_factory, pytestconfig) -> Iterator[WorkerHandle]:
    """A prefork worker (-c 2) whose app sets no ``redlock_nodes``."""
    yield from _worker(topology, tmp_path_factory, pytestconfig, "onenode", 11, CRL_NODES="")


@pytest.fixture(scope="module")
def quorum_worker(topology, tmp_path_factory, pytestconfig) -> Iterator[WorkerHandle]:
    """A prefork worker (-c 2) on the three quorum nodes."""
    yield from _worker(topology, tmp_path_factory, pytestconfig, "outage", 13)


@pytest.fixture(scope="module")
def nowhere() -> str:
    """A node URL, with a password, on a loopback port where nothing listens."""
    return f"redis://:s3cret@127.0.0.1:{free_port()}/0"


@pytest.fixture(scope="module")
def missing_node_worker(
    topology, tmp_path_factory, pytestconfig, nowhere
) -> Iterator[WorkerHandle]:
    """A prefork worker (-c 2) on two quorum nodes and ``nowhere``."""
    nodes = ",".join([*topology.quorum.urls[:2], nowhere])
    yield from _worker(topology, tmp_path_factory, pytestconfig, "missing", 7, CRL_NODES=nodes)


def _log(worker: WorkerHandle) -> str:
    assert worker.process is not None
    with open(worker.process.logfile, errors="replace") as f:
        return f.read()


def test_a_worker_without_redlock_nodes_says_the_broker_is_its_one_lock_node(
    broker_node_worker: WorkerHandle, topology: Topology
):
    said = f"lock node: {topology.url(11)} (the broker's Redis, as redlock_nodes is not set)"
    wait_for(lambda: said in _log(broker_node_worker), 10, "the lock node line")
    lines = [line for line in _log(broker_node_worker).splitlines() if "lock node" in line]
    assert len(lines) == 1, lines  # the main process says it, not each pool child
    assert "INFO/MainProcess" in lines[0] and "ONE node" in lines[0], lines
    # and the lock does live there
    result = broker_node_worker.task("slow").apply_async(("one", harness.new_run()))
    assert result.get(timeout=20)["token"] > 0


def test_a_worker_on_three_nodes_names_them_and_the_quorum(quorum_worker: WorkerHandle):
    said = f"lock nodes: {', '.join(quorum_worker.topology.quorum.urls)} (quorum 2 of 3)"
    wait_for(lambda: said in _log(quorum_worker), 10, "the lock nodes line")
    assert "ONE node" not in _log(quorum_worker)


def test_a_worker_starting_with_a_node_that_does_not_answer_warns_once(
    missing_node_worker: WorkerHandle, nowhere: str
):
    masked = nowhere.replace("s3cret", "***")
    said = f"lock node not answering at start: {masked}: "
    wait_for(lambda: said in _log(missing_node_worker), 20, "the start warning")
    lines = [line for line in _log(missing_node_worker).splitlines() if said in line]
    assert len(lines) == 1, lines  # the main process says it, not each pool child
    assert "WARNING/MainProcess" in lines[0], lines
    assert lines[0].endswith("; 2 of 3 answered, the quorum tolerates no further node failure"), (
        lines
    )
    assert "s3cret" not in _log(missing_node_worker)
    # It still locks, on the two nodes that answer.
    result = missing_node_worker.task("slow").apply_async(("missing", harness.new_run()))
    assert result.get(timeout=20)["token"] > 0


def test_a_worker_whose_nodes_all_answer_does_not_warn(quorum_worker: WorkerHandle):
    said = "lock nodes: "
    wait_for(lambda: said in _log(quorum_worker), 10, "the lock nodes line")
    assert "not answering at start" not in _log(quorum_worker)


def test_a_node_that_answers_when_asked_again_at_start_is_not_named(monkeypatch, caplog):
    """The start check asks a node that did not answer once more: a node paused through
    the first round and resumed before the second is no outage to warn of; one that
    fails both is named."""
    with RedisNodes(3) as nodes:
        app = Celery("start-check", set_as_current=False)
        app.conf.redlock_nodes = nodes.urls

        @app.task(base=LockedTask, shared=False, name="start.check")
        def check() -> None: ...

        settings = plan_of(app.tasks["start.check"]).resolved
        rounds: list[dict[str, str]] = []
        ask = signals._unanswered

        def asked(client):
            rounds.append(ask(client))
            nodes.resume(2)  # back for the second round, if there is one
            return rounds[-1]

        monkeypatch.setattr(signals, "_unanswered", asked)
        nodes.pause(2)
        with caplog.at_level("WARNING", logger="celery_redlock"):
            signals._warn_unanswered(settings)
        assert len(rounds) == 2 and nodes.urls[2] in rounds[0], rounds
        assert "not answering at start" not in caplog.text

        nodes.kill(1)  # refuses both rounds
        rounds.clear()
        with caplog.at_level("WARNING", logger="celery_redlock"):
            signals._warn_unanswered(settings)
        assert len(rounds) == 2 and nodes.urls[1] in rounds[1], rounds
        assert f"not answering at start: {nodes.urls[1]}: " in caplog.text
        assert "2 of 3 answered" in caplog.text


def test_an_outage_is_said_once_when_it_starts_and_once_when_it_ends(
    quorum_worker: WorkerHandle, topology: Topology
):
    slow = quorum_worker.task("slow")
    run = harness.new_run()
    # Both pool children take a lock first, so both know the nodes answered.
    warm = [slow.apply_async((f"warm{i}", run), {"duration": 0.5}) for i in range(2)]
    for result in warm:
        assert result.get(timeout=20)["token"] > 0
    start = len(_log(quorum_worker))
    down = topology.quorum.urls[1:]
    try:
        for index in (1, 2):
            topology.quorum.kill(index)
        result = slow.apply_async(("during", run), {"duration": 0.05})
        retry = f"[{result.id}]: lock nodes unavailable, retry "
        wait_for(lambda: _log(quorum_worker)[start:].count(retry) >= 4, 30, "four retries")
    finally:
        for index in (1, 2):
            topology.quorum.restart(index)
    assert result.get(timeout=30)["token"] > 0
    log = _log(quorum_worker)[start:].splitlines()

    started = [line for line in log if "lock nodes unavailable: " in line]
    # At most once per pool child (each says it for itself), here usually one.
    assert 1 <= len(started) <= 2, started
    assert all("WARNING/" in line for line in started)
    assert all(f"{url}: " in started[0] for url in down), started[0]  # each node's error
    assert "1 of 3 answered, 2 needed" in started[0]

    attempts = [line for line in log if retry in line]
    assert len(attempts) >= 4
    for n, line in enumerate(attempts, start=1):  # short: no node, no error text
        assert re.search(rf"retry {n} of \d+$", line), line
        assert not any(url in line for url in down), line

    ended = [line for line in log if "lock nodes answer again" in line]
    assert 1 <= len(ended) <= len(started), ended
    assert all("INFO/" in line for line in ended)
    assert log.index(ended[-1]) > log.index(attempts[-1])
    print(f"\noutage: {attempts[0]}\n        {ended[0]}")
