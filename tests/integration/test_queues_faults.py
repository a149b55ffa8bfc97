"""``lock_on_duplicate="queue"`` with real prefork workers of their own and real
redis-server lock nodes: fairness across keys on 3 pool processes, and when
things fail: a whole worker killed under its holder, a worker restarted
mid-queue, a lock node restarted empty. Nothing is lost, and the calls keep
their order.

Each test runs its own workers on a queue of its own, so killing or restarting
them touches nothing else. Time bounds are the event's own with 3x slack for a
loaded 2-core host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support import harness, lockapp
from tests.support.brokers import delete, require_amqp
from tests.support.harness import Topology, WorkerHandle, assert_no_overlap, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: The lock TTL of the test app (BASE_CONF).
TTL = 2.0


def seqs(runs: list[dict]) -> list[int]:
    return [r["seq"] for r in sorted(runs, key=lambda r: r["start"])]


@contextmanager
def private_queue(topology: Topology, broker: str, backend_db: int) -> Iterator[tuple[dict, str]]:
    """A worker environment on a queue of its own (``broker`` "redis" or "amqp")."""
    queue = f"qf-{harness.new_run()[:10]}"
    env = topology.env(13, backend_db)
    if broker == "amqp":
        env["CRL_BROKER_URL"] = require_amqp()
    env["CRL_CONF"] = json.dumps({"task_default_queue": queue, "control_exchange": queue})
    yield env, queue


def client(topology: Topology, env: dict, main: str) -> WorkerHandle:
    app = lockapp.app_from_env(env, main=main)
    topology.apps.append(app)
    return WorkerHandle("prefork", app, topology)


def worker(name: str, env: dict, queue: str, tmp_path_factory, concurrency: int = 2):
    logdir = str(tmp_path_factory.mktemp(name))
    return harness.PreforkWorker(name, env, logdir, queues=[queue], concurrency=concurrency)


def ends(handle: WorkerHandle, run: str, n: int, timeout: float) -> list[dict]:
    wait_for(lambda: len(handle.records(run, "end")) >= n, timeout, f"{n} ends", 0.2)
    return handle.records(run, "end")


def test_a_holders_whole_worker_killed_hands_over_after_its_ttl(
    topology: Topology, tmp_path_factory, pytestconfig
):
    """The holder's worker (main process and pool) is SIGKILLed: its key lapses
    at its TTL, the queue's watch (given back by RabbitMQ to the other worker)
    hands the key over, and the waiting calls run there, in order. The bound is
    2.5 TTLs (5 s) after the kill, 15 s here."""
    harness.WORKER_LOGS.register(pytestconfig)
    with private_queue(topology, "amqp", 9) as (env, queue):
        handle = client(topology, env, "qf-kill-client")
        first = worker("qf-kill-a", env, queue, tmp_path_factory).start()
        second = None
        try:
            task = handle.task("queued")
            run, key = harness.new_run(), f"wk-{harness.new_run()}"
            task.delay(key, run, duration=60.0, seq=0)
            wait_for(lambda: handle.records(run, "start"), 20, "the holder", 0.05)
            second = worker("qf-kill-b", env, queue, tmp_path_factory).start()
            for i in range(1, 7):
                task.delay(key, run, duration=0.05, seq=i)
            time.sleep(0.3)
            killed = time.time()
            first.stop(now=True)  # SIGKILL, main process and pool at once
            runs = ends(handle, run, 6, 60)
            assert seqs(runs) == list(range(1, 7))
            assert_no_overlap(runs)
            resumed = min(r["start"] for r in runs) - killed
            assert resumed < 15.0, f"the queue resumed {resumed:.1f}s after the kill"
        finally:
            first.stop(now=True)
            if second is not None:
                second.stop(now=True)
            delete(handle.app, queue)


def test_a_worker_restarted_mid_queue_loses_nothing(
    topology: Topology, tmp_path_factory, pytestconfig
):
    """A deploy: the worker is stopped (warm shutdown) with calls running and
    waiting, and a new one started: every call runs once, in publish order.
    On RabbitMQ: on Redis, kombu's transport may drop a message its last BRPOP
    took as the worker shut down (celery/celery#4354), a handed call among them,
    which then waits for its claim to lapse (the queues page says so)."""
    harness.WORKER_LOGS.register(pytestconfig)
    with private_queue(topology, "amqp", 14) as (env, queue):
        handle = client(topology, env, "qf-restart-client")
        old = worker("qf-restart-1", env, queue, tmp_path_factory).start()
        new = None
        try:
            task = handle.task("queued")
            run, key = harness.new_run(), f"rs-{harness.new_run()}"
            results = [task.delay(key, run, duration=0.2, seq=i) for i in range(20)]
            wait_for(lambda: len(handle.records(run, "end")) >= 5, 30, "5 ends", 0.05)
            old.stop(term_timeout=20)  # SIGTERM: the running call finishes and hands over
            new = worker("qf-restart-2", env, queue, tmp_path_factory).start()
            runs = ends(handle, run, 20, 60)
            assert [r.get(timeout=30)["token"] > 0 for r in results] == [True] * 20
            time.sleep(0.5)
            runs = handle.records(run, "end")
            assert seqs(runs) == list(range(20))
            assert_no_overlap(runs)
        finally:
            old.stop(now=True)
            if new is not None:
                new.stop(now=True)
            delete(handle.app, queue)


def test_a_lock_node_restarted_empty_loses_nothing(
    topology: Topology, tmp_path_factory, pytestconfig
):
    """One lock node of three restarts empty mid-queue (a minority): the waiting
    calls are on the other two, and every call runs once, in publish order."""
    harness.WORKER_LOGS.register(pytestconfig)
    with private_queue(topology, "redis", 15) as (env, queue):
        handle = client(topology, env, "qf-node-client")
        proc = worker("qf-node", env, queue, tmp_path_factory).start()
        try:
            task = handle.task("queued")
            run, key = harness.new_run(), f"nd-{harness.new_run()}"
            for i in range(20):
                task.delay(key, run, duration=0.1, seq=i)
            wait_for(lambda: len(handle.records(run, "end")) >= 4, 30, "4 ends", 0.05)
            topology.quorum.restart(0)  # same port, empty
            for i in range(20, 25):  # parked after the restart, behind the others
                task.delay(key, run, duration=0.1, seq=i)
            runs = ends(handle, run, 25, 60)
            time.sleep(0.5)
            runs = handle.records(run, "end")
            assert seqs(runs) == list(range(25))
            assert_no_overlap(runs)
        finally:
            proc.stop(now=True)
            delete(handle.app, queue)


def test_a_hot_keys_backlog_never_delays_other_keys(
    topology: Topology, tmp_path_factory, pytestconfig
):
    """3 pool processes; a hot key with 60 queued 0.2 s calls, then one call of each
    of 5 other keys: each starts within about one task duration of its send on a
    quiet host (the broker holds one message of the hot key, not 60), while the hot
    key's calls keep their order. Bounded by the event, not the clock: a starved
    host (0.2 s calls seen taking 3.9 s beside busy loops) delays the cold calls by
    seconds, but the hot key's backlog never runs ahead of them: a few of its calls
    start in the meantime, not the 55 still queued."""
    harness.WORKER_LOGS.register(pytestconfig)
    with private_queue(topology, "redis", 10) as (env, queue):
        handle = client(topology, env, "qf-fair-client")
        proc = worker("qf-fair", env, queue, tmp_path_factory, concurrency=3).start()
        try:
            task = handle.task("queued")
            run, hot = harness.new_run(), f"hot-{harness.new_run()}"
            for i in range(60):
                task.delay(hot, run, duration=0.2, seq=i)
            wait_for(lambda: handle.records(run, "start"), 20, "the hot key", 0.05)
            time.sleep(0.5)
            cold_run, sent = harness.new_run(), {}
            for k in range(5):
                key = f"cold-{k}-{cold_run}"
                sent[key] = time.time()
                task.delay(key, cold_run, duration=0.2, seq=100 + k)
            wait_for(lambda: len(handle.records(cold_run, "start")) == 5, 20, "5 cold", 0.05)
            cold = handle.records(cold_run, "start")
            late = {r["key"]: r["start"] - sent[r["key"]] for r in cold}
            first_sent, last_cold = min(sent.values()), max(r["start"] for r in cold)
            ahead = [
                r["seq"]
                for r in handle.records(run, "start")
                if first_sent <= r["start"] <= last_cold
            ]
            assert len(ahead) <= 10, (ahead, late)
            runs = ends(handle, run, 60, 90)
            assert seqs(runs) == list(range(60))
            assert_no_overlap(runs)
        finally:
            proc.stop(now=True)
            delete(handle.app, queue)
