"""A redelivered message: ignored while its first delivery runs, run once that one died.

The eager tests stage the first delivery by hand; the last one has real
brokers (Redis and RabbitMQ) redeliver the message of a worker killed mid-task.
"""

import contextlib
import json
import os
import signal
import time
import uuid

import kombu
import pytest
from celery import Celery, states
from celery import signals as celery_signals
from celery.contrib.testing.worker import start_worker
from celery.exceptions import TaskRevokedError
from kombu.asynchronous import set_event_loop

from celery_redlock import LockContended, LockedTask, plan_of
from celery_redlock.core import heartbeat
from celery_redlock.redlock import make_owner
from tests.support import harness, lockapp

pytestmark = pytest.mark.integration

TTL = 1.0

#: How long the test waits for a dead worker's message to run again. kombu 5.5's
#: Redis transport looks for unacked messages past their visibility timeout
#: only on every tenth tick of a 10 s timer, so up to 100 s after it; kombu 5.7
#: honours ``unacked_restore_interval``.
REDELIVERY_WAIT = 60 if kombu.VERSION >= (5, 7) else 150


@pytest.fixture
def app(redis_nodes3):
    app = Celery("redelivery", set_as_current=False)
    app.conf.update(redlock_nodes=redis_nodes3.urls, redlock_ttl=TTL, redlock_node_timeout=0.5)
    ran = []

    @app.task(base=LockedTask, bind=True, lock_on=("k",), name="redelivery.work", shared=False)
    def work(self, k):
        ran.append(self.request.id)
        return self.request.redlock.fencing_token

    app.finalize()
    app.ran = ran
    yield app
    app.close()


def first_delivery(app, task_id, renewed):
    """The lock as the first delivery of ``task_id`` took it (retries 0)."""
    task = app.tasks["redelivery.work"]
    plan = plan_of(task)
    lease = plan.redlock.acquire(plan.keys.build(("x",), {}), ttl=TTL, owner=make_owner(task_id, 0))
    if renewed:
        heartbeat.hold(lease, TTL / 3)
    return plan.redlock, lease


def test_a_redelivery_runs_once_the_first_delivery_died(app):
    redlock, lease = first_delivery(app, "task-1", renewed=False)  # nobody renews: it died
    started = time.monotonic()
    result = app.tasks["redelivery.work"].apply(("x",), task_id="task-1")
    waited = time.monotonic() - started
    assert result.successful(), result.traceback
    assert app.ran == ["task-1"]
    assert result.result > lease.fencing_token
    assert TTL * 0.5 < waited < TTL * 1.5 + 0.5, waited


def test_an_eager_call_is_never_a_copy(app):
    """Its id held and renewed elsewhere, an eager call waits out 1.5 TTL like a copy
    would, then gives up as ``lock_on_exhausted`` says (``raise`` by default): an
    error, never ignored with a result it did not compute."""
    redlock, lease = first_delivery(app, "task-2", renewed=True)
    try:
        started = time.monotonic()
        result = app.tasks["redelivery.work"].apply(("x",), task_id="task-2")
        waited = time.monotonic() - started
        assert result.state == states.FAILURE and isinstance(result.result, LockContended)
        assert app.ran == []
        assert waited >= TTL * 1.5 - 0.1, waited
        assert not lease.lost
    finally:
        heartbeat.drop(lease)
        redlock.release(lease)


def test_a_duplicate_with_another_task_id_is_dropped_at_once(app):
    redlock, lease = first_delivery(app, "task-3", renewed=True)
    try:
        started = time.monotonic()
        result = app.tasks["redelivery.work"].apply(("x",), task_id="task-4")
        assert isinstance(result.result, TaskRevokedError)  # a copy would end LockContended
        assert time.monotonic() - started < TTL * 1.5  # not after the 1.5 TTL a copy waits
    finally:
        heartbeat.drop(lease)
        redlock.release(lease)


# -- an in-process solo worker: deliveries that find their own task id -------------


@contextlib.contextmanager
def solo_worker(lock_nodes, broker, **conf):
    """A Celery app with one task, ``copies.work`` (lock_on k), and a solo worker
    running it in a thread of this process; yields the app (``app.ran``: ids run)."""
    app = Celery("copies", broker=broker.url, backend=broker.url[:-1] + "1", set_as_current=False)
    app.conf.update(
        redlock_nodes=lock_nodes.urls,
        redlock_ttl=2.0,
        redlock_node_timeout=0.2,
        redlock_retry_backoff=0.2,
        redlock_retry_backoff_max=1.0,
        broker_connection_retry_on_startup=True,
        **conf,
    )
    ran = []

    @app.task(base=LockedTask, bind=True, lock_on=("k",), name="copies.work", shared=False)
    def work(self, k):
        ran.append((self.request.id, time.time()))
        return self.request.redlock.fencing_token

    app.ran = ran
    set_event_loop(None)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
            yield app
    finally:
        set_event_loop(None)
        app.close()


def lock_key(app, *args):
    plan = plan_of(app.tasks["copies.work"])
    return plan.redlock.keys(plan.keys.build(args, {}))[0]


@pytest.mark.timeout(90)
def test_a_leftover_of_its_own_id_then_another_holder_does_not_lose_the_task(
    redis_nodes5, redis_node_factory
):
    """The reproduction of a task never run: 5 lock nodes, 2 of them down; the task's own
    owner value left on node 0 (an attempt whose acquire landed after its release round),
    lapsing in 1.5 s; when it lapses, another task takes the key on nodes 0-2 for 5 s.
    The delivery watches its own id's leftover, sees another holder, and, with ``retry``,
    runs once that holder is gone. (The other task holds node 1 from the start, so the
    delivery cannot take the key in the instant between the lapse and the take-over.)"""
    redis_nodes5.kill(3)
    redis_nodes5.kill(4)
    broker = redis_node_factory(1)[0]
    with solo_worker(redis_nodes5, broker, redlock_on_duplicate="retry") as app:
        tid = uuid.uuid4().hex
        key = lock_key(app, "x")
        other = make_owner("another-task", 0)
        clients = [redis_nodes5[i].client() for i in range(3)]
        clients[0].set(key, f"{tid}|0|somehost|4242|0123456789abcdef", px=1500)
        clients[1].set(key, other, px=6500)
        result = app.tasks["copies.work"].apply_async(("x",), task_id=tid)
        harness.wait_for(lambda: clients[0].get(key) is None, 10, "the leftover to lapse")
        for client in (clients[0], clients[2]):
            client.set(key, other, px=5000)
        taken_over = time.time()
        token = result.get(timeout=60)
        assert result.state == states.SUCCESS and isinstance(token, int)
        time.sleep(1.0)  # nothing more runs
        assert [i for i, _ in app.ran] == [tid]
        assert app.ran[0][1] >= taken_over + 4.5  # after the other holder's 5 s
        for client in clients:
            client.close()


@pytest.mark.timeout(60)
def test_a_delivery_of_a_running_task_id_is_ignored(redis_nodes3, redis_node_factory):
    """A second delivery of an id whose first delivery holds the key and renews it is
    a copy: after watching it for 1.5 TTL it is acked, stores nothing, runs nothing."""
    broker = redis_node_factory(1)[0]
    with solo_worker(redis_nodes3, broker) as app:
        task = app.tasks["copies.work"]
        plan = plan_of(task)
        tid = uuid.uuid4().hex
        ends = []

        def ended(sender=None, task_id=None, state=None, **_):
            ends.append((task_id, state, time.monotonic()))

        celery_signals.task_postrun.connect(ended, sender=task, weak=False)
        lease = plan.redlock.acquire(plan.keys.build(("x",), {}), ttl=2.0, owner=make_owner(tid, 0))
        heartbeat.hold(lease, 2.0 / 3)
        try:
            started = time.monotonic()
            result = task.apply_async(("x",), task_id=tid)
            harness.wait_for(lambda: ends, 20, "the copy to end")
            [(ended_id, state, at)] = ends
            assert ended_id == tid and state == states.IGNORED
            assert at - started >= 2.0 * 1.5 - 0.1
            assert app.ran == [] and result.state == states.PENDING  # nothing stored
            assert not lease.lost
        finally:
            celery_signals.task_postrun.disconnect(ended, sender=task)
            heartbeat.drop(lease)
            plan.redlock.release(lease)


# -- a real broker redelivers the message of a worker that died --------------------


@pytest.fixture(params=["redis", "amqp"])
def two_workers(request, topology, tmp_path_factory, pytestconfig):
    """Two prefork workers (-c 1, acks_late) on one queue of the broker in the param.

    Redis redelivers an unacked message after the visibility timeout (3 s here),
    RabbitMQ as soon as the consumer's connection drops.
    """
    harness.WORKER_LOGS.register(pytestconfig)
    queue = f"crl-redeliver-{uuid.uuid4().hex[:12]}"
    conf = {"task_acks_late": True, "task_default_queue": queue}
    if request.param == "amqp":
        env = dict(topology.env(0, 11), CRL_BROKER_URL=request.getfixturevalue("amqp_url"))
    else:
        env = topology.env(10, 11)
        conf["broker_transport_options"] = {
            "visibility_timeout": 3,
            "unacked_restore_interval": 0.5,
        }
    env["CRL_CONF"] = json.dumps(conf)
    logdir = str(tmp_path_factory.mktemp("redeliver"))
    procs = [
        harness.PreforkWorker(f"redeliver{i}", env, logdir, queues=[queue], concurrency=1)
        for i in range(2)
    ]
    try:
        for proc in procs:
            proc.launch()
        for proc in procs:
            proc.await_ready()
        app = lockapp.app_from_env(env, main="redeliver-client")
        topology.apps.append(app)
        yield harness.WorkerHandle(f"prefork-{request.param}", app, topology), procs
    finally:
        for proc in procs:
            proc.stop(now=True)
        if request.param == "amqp":
            harness.delete_amqp_queue(env["CRL_BROKER_URL"], queue)


@pytest.mark.timeout(REDELIVERY_WAIT + 60)
def test_a_message_redelivered_after_its_worker_died_runs_once_its_lease_lapses(
    two_workers, topology
):
    """SIGKILL the whole worker running a task (acks_late): the broker hands the message
    to the other worker, which waits out the dead holder's lease and runs it, fenced above it."""
    handle, procs = two_workers
    run = uuid.uuid4().hex
    result = handle.task("slow").apply_async((run, run), {"duration": 1.0})
    [first] = harness.wait_for(
        lambda: handle.records(run, "start"), 20, "the first delivery to start"
    )
    [victim] = [p for p in procs if first["pid"] in p.session_pids()]
    for pid in victim.session_pids():
        os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    value = result.get(timeout=REDELIVERY_WAIT)
    starts = handle.records(run, "start")
    ends = handle.records(run)
    assert [r["id"] for r in starts] == [result.id, result.id]
    assert [r["id"] for r in ends] == [result.id]  # the first delivery never ended
    second = ends[0]
    assert second["pid"] != first["pid"]
    assert value["token"] == second["token"] > first["token"]
    # the second delivery took the key only once the dead holder's lease lapsed
    ttl = plan_of(handle.task("slow")).settings.ttl
    assert second["start"] >= max(killed_at - 0.1, first["start"] + ttl / 2)
    topology.assert_no_lock_keys()
