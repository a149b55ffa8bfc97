"""Uniqueness over a task's whole life: enqueue claims, same-id copies, receipts.

Real redis-server nodes, a real prefork worker (subprocess) on a Redis broker
and on RabbitMQ, producers in processes of their own. Messages are counted on
the broker: calls go to a queue no worker consumes yet, the broker tells its
length, and only then does the worker start consuming it.
"""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest
import redis
from celery import chord, group, states
from celery.exceptions import ChordError, TaskRevokedError
from kombu.exceptions import SerializerNotInstalled

from celery_redlock import AlreadyEnqueued, plan_of, superseded_by
from celery_redlock.headers import CLAIM
from tests.support import harness, lockapp
from tests.support.brokers import delete, purge, queued, require_amqp
from tests.support.harness import Topology, WorkerHandle, assert_no_overlap, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

QUEUE = "claims"  # the worker's queue is this plus a random suffix
#: The node timeout of the test's own calls: a producer process's first claim opens
#: its connections inside the round (on PostgreSQL a backend forked, statements
#: prepared), which a loaded host took past 0.5 s. Below the shortest lock TTL of
#: the test app's tasks (1.2 s), as the bind check requires.
NODE_TIMEOUT = 1.0


def start_claims_worker(request, topology: Topology, tmp_path_factory, pytestconfig):
    """A prefork worker (-c 4) consuming ``claims``, on a Redis broker and on RabbitMQ.

    Results go to a Redis DB of the topology either way.
    """
    harness.WORKER_LOGS.register(pytestconfig)
    env = topology.env(5, 6)
    if request.param == "amqp":
        env = dict(topology.env(11, 12), CRL_BROKER_URL=require_amqp())
    queue = f"{QUEUE}-{harness.new_run()[:8]}"  # RabbitMQ keeps queues: one per session
    # Control commands of its own too: other sessions' workers on the same RabbitMQ
    # would hear a broadcast add_consumer and take the messages of the test's queue.
    env["CRL_CONF"] = json.dumps({"task_default_queue": queue, "control_exchange": queue})
    logdir = str(tmp_path_factory.mktemp(f"claims-{request.param}"))
    proc = harness.PreforkWorker(
        f"claims-{request.param}", env, logdir, queues=[queue], concurrency=4
    ).start()
    app = lockapp.app_from_env(env, main="claims-client")
    # The test's own calls claim too: a node that stalls past the 50 ms default on
    # a busy host would count as an outage and publish a second message (by design).
    app.conf.redlock_node_timeout = NODE_TIMEOUT
    app.producer_env = env  # the producer processes build the same app
    topology.apps.append(app)
    try:
        yield WorkerHandle(request.param, app, topology, proc)
    finally:
        proc.stop(now=True)
        delete(app, queue)


claims_worker = pytest.fixture(scope="module", params=["redis", "amqp"], name="claims_worker")(
    start_claims_worker
)


@pytest.fixture(autouse=True)
def _nothing_left_without_a_ttl(topology: Topology):
    """After every test: no lock key, and every claim and receipt key expires."""
    yield
    topology.assert_no_lock_keys()
    topology.assert_every_key_expires("claim", "receipt")


@pytest.fixture
def hold(claims_worker: WorkerHandle, run: str):
    """A queue no worker consumes until the test says so; deleted afterwards."""
    queue = f"hold-{run}"
    yield queue
    delete(claims_worker.app, queue)


def _produce(env, name, args, kwargs, count, queue, start, out):
    app = lockapp.app_from_env(env, main="producer")
    # Thirty claims at once on a busy host: a producer that stalls past the 50 ms
    # default would count as an outage and publish without a claim (by design),
    # and the test is about the election on healthy nodes. (Below the 2 s TTL.)
    app.conf.redlock_node_timeout = NODE_TIMEOUT
    task = app.tasks[name]
    start.wait(30)
    out.put([task.apply_async(args, kwargs, queue=queue).id for _ in range(count)])


def produce_from_processes(handle: WorkerHandle, name, args, kwargs, queue, procs=3, count=10):
    """``count`` calls from each of ``procs`` producer processes, all at once: their ids."""
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    env = handle.app.producer_env
    workers = [
        ctx.Process(target=_produce, args=(env, name, args, kwargs, count, queue, start, out))
        for _ in range(procs)
    ]
    for p in workers:
        p.start()
    start.set()
    ids = [i for _ in workers for i in out.get(timeout=60)]
    for p in workers:
        p.join(30)
        assert p.exitcode == 0
    return ids


def control(handle: WorkerHandle, command: str, queue: str) -> list:
    """``add_consumer`` or ``cancel_consumer`` sent to this worker only: a broadcast
    reaches another session's worker on the same RabbitMQ, which would take the
    message and free its claim on its own nodes, not ours."""
    assert handle.process is not None
    with handle.app.connection_for_write() as conn:  # a fresh connection: none gone stale
        return getattr(handle.app.control, command)(
            queue,
            destination=[handle.process.hostname],
            reply=True,
            timeout=5,
            limit=1,
            connection=conn,
        )


def consume(handle: WorkerHandle, queue: str) -> None:
    assert control(handle, "add_consumer", queue), "the worker did not answer add_consumer"


def stop_consuming(handle: WorkerHandle, queue: str) -> None:
    control(handle, "cancel_consumer", queue)
    purge(handle.app, queue)


def claimant(handle: WorkerHandle, task, args, kwargs=None):
    plan = plan_of(task)
    return plan.redlock.claimant(plan.keys.build(args, kwargs or {})).claimant


# -- until_finished / until_started with "return" ----------------------------------


def test_until_finished_publishes_one_message_for_every_caller(claims_worker, run, hold):
    task = claims_worker.task("once_finished")
    ids = produce_from_processes(claims_worker, task.name, (run, run), {"duration": 3.0}, hold)
    assert len(ids) == 30 and len(set(ids)) == 1, set(ids)
    time.sleep(0.3)  # let the broker count every message sent
    assert queued(claims_worker.app, hold) == 1  # one message on the broker
    first = ids[0]
    consume(claims_worker, hold)
    try:
        wait_for(lambda: claims_worker.records(run, "start"), 20, "the run to start")
        more = [task.apply_async((run, run), {"duration": 3.0}).id for _ in range(10)]
        assert set(more) == {first}  # while it runs, still the same task
        assert task.AsyncResult(first).get(timeout=20)["token"]
    finally:
        stop_consuming(claims_worker, hold)
    time.sleep(0.5)
    assert [r["id"] for r in claims_worker.records(run)] == [first]
    assert claimant(claims_worker, task, (run, run)) is None  # withdrawn at the end


def test_until_started_keeps_one_running_and_one_waiting(claims_worker, run, hold):
    task = claims_worker.task("once_started")
    ids = produce_from_processes(claims_worker, task.name, (run, run), {"duration": 3.0}, hold)
    time.sleep(0.3)
    assert len(set(ids)) == 1 and queued(claims_worker.app, hold) == 1
    consume(claims_worker, hold)
    try:
        wait_for(lambda: claims_worker.records(run, "start"), 20, "the first run to start")
        waiting = [task.apply_async((run, run), {"duration": 0.5}).id for _ in range(10)]
        assert len(set(waiting)) == 1 and waiting[0] != ids[0]
        time.sleep(0.3)
        assert task.apply_async((run, run), {"duration": 0.5}).id == waiting[0]
        task.AsyncResult(waiting[0]).get(timeout=30)
    finally:
        stop_consuming(claims_worker, hold)
    runs = claims_worker.records(run)
    assert [r["id"] for r in runs] == [ids[0], waiting[0]]
    assert_no_overlap(runs)
    assert runs[1]["start"] >= runs[0]["end"]


def test_raise_names_the_claiming_task(claims_worker, run):
    task = claims_worker.task("once_raise")
    first = task.apply_async((run, run), {"duration": 1.0})
    with pytest.raises(AlreadyEnqueued) as caught:
        task.delay(run, run, duration=1.0)
    assert caught.value.task_id == first.id
    assert first.id in str(caught.value) and 0 < caught.value.remaining <= 3601
    first.get(timeout=20)


def test_replace_runs_the_newest_arguments_and_revokes_the_rest(claims_worker, run):
    task = claims_worker.task("once_replace")
    running = task.apply_async((run, run), {"duration": 5.0, "note": "running"})
    wait_for(lambda: claims_worker.records(run, "start"), 20, "the first run to start")
    calls = [task.apply_async((run, run), {"duration": 0.2, "note": i}) for i in range(5)]
    assert claimant(claims_worker, task, (run, run)) == calls[-1].id
    calls[-1].get(timeout=30)
    running.get(timeout=5)
    for i, replaced in enumerate(calls[:-1]):
        with pytest.raises(TaskRevokedError) as caught:
            replaced.get(timeout=20)
        successor = str(caught.value).removeprefix("superseded by task ")
        assert successor in [c.id for c in calls[i + 1 :]], str(caught.value)
    runs = claims_worker.records(run)
    assert [r["note"] for r in runs] == ["running", 4]
    assert_no_overlap(runs)
    for replaced in calls[:-1]:
        assert superseded_by(replaced).id == calls[-1].id
    assert superseded_by(calls[-1]) is None and superseded_by(running) is None


def test_send_task_by_name_does_not_bypass_the_claim(claims_worker, run):
    task = claims_worker.task("once_finished")
    claimed = task.apply_async((run, run), {"duration": 0.2}, countdown=2)
    bypass = claims_worker.app.send_task(task.name, (run, run), {"duration": 0.2})
    with pytest.raises(TaskRevokedError) as caught:
        bypass.get(timeout=20)
    assert f"claimed by task {claimed.id}" in str(caught.value)
    claimed.get(timeout=20)
    assert [r["id"] for r in claims_worker.records(run)] == [claimed.id]


# -- orphans ------------------------------------------------------------------------


def test_a_revoked_message_frees_its_claim_when_the_worker_discards_it(claims_worker, run, hold):
    task = claims_worker.task("once_finished")
    revoked = task.apply_async((run, run), queue=hold)
    revoked.revoke()
    assert claimant(claims_worker, task, (run, run)) == revoked.id
    time.sleep(0.3)
    assert queued(claims_worker.app, hold) == 1
    consume(claims_worker, hold)
    try:
        # The worker takes the message off the queue and discards it: it stores the
        # REVOKED state, then frees the claim; gone with the message, not at its TTL
        # (an hour). The waits are for those events; the caps only catch a hang.
        wait_for(lambda: queued(claims_worker.app, hold) == 0, 30, "the worker to take it")
        wait_for(lambda: revoked.state == states.REVOKED, 30, "the REVOKED state")
        wait_for(lambda: claimant(claims_worker, task, (run, run)) is None, 30, "the claim to go")
    finally:
        stop_consuming(claims_worker, hold)
    later = task.apply_async((run, run), {"duration": 0.1})
    assert later.id != revoked.id
    later.get(timeout=20)
    assert [r["id"] for r in claims_worker.records(run)] == [later.id]


def test_a_publish_that_fails_withdraws_its_claim(claims_worker, run):
    task = claims_worker.task("once_finished")
    with pytest.raises(SerializerNotInstalled):  # the error still reaches the caller
        task.apply_async((run, run), serializer="no-such-serializer")
    assert claimant(claims_worker, task, (run, run)) is None
    task.apply_async((run, run), {"duration": 0.1}).get(timeout=20)


def test_a_message_for_an_unknown_task_frees_its_claim(claims_worker, run):
    task = claims_worker.task("once_finished")
    plan = plan_of(task)
    name = plan.keys.build((run, run), {})
    stray = "stray-" + run
    plan.redlock.claim_next(name, stray, ttl=60)
    claims_worker.app.send_task("lockapp.no_such_task", task_id=stray, headers={CLAIM: name})
    wait_for(lambda: claimant(claims_worker, task, (run, run)) is None, 10, "the claim to go")


def test_canvas_members_are_published_without_a_claim(claims_worker, run):
    task = claims_worker.task("once_finished")
    members = group(task.s(run, run, 0.2, note=i) for i in range(2)).apply_async()
    assert claimant(claims_worker, task, (run, run)) is None  # the group waits for its ids
    members.get(timeout=20, propagate=False)
    assert len({r.id for r in members.results}) == 2
    assert len(claims_worker.records(run)) >= 1  # the run lock still guards their runs
    assert_no_overlap(claims_worker.records(run))


def test_a_purged_message_leaves_a_claim_that_lapses_at_its_ttl(claims_worker, run, hold):
    task = claims_worker.task("once_short")  # lock_enqueue_ttl = 2 s
    lost = task.apply_async((run, run), queue=hold)
    assert purge(claims_worker.app, hold) == 1  # the queue is purged: the message is gone
    assert task.apply_async((run, run)).id == lost.id  # still claimed...
    # at its TTL (2 s), not an hour later: 3x that on a busy host
    wait_for(lambda: claimant(claims_worker, task, (run, run)) is None, 6.0, "the claim to lapse")
    later = task.apply_async((run, run))
    assert later.id != lost.id
    later.get(timeout=20)


def _claim_keys(handle: WorkerHandle, task, args) -> list:
    """The claim key of ``args`` on each quorum node (None where it is gone)."""
    plan = plan_of(task)
    key = plan.redlock.claim_key(plan.keys.build(args, {}))
    values = []
    for url in handle.topology.quorum.urls:
        with redis.Redis.from_url(url) as client:
            values.append(client.get(key))
    return values


def test_a_queued_message_whose_claim_lapsed_runs(claims_worker, run, hold):
    task = claims_worker.task("once_short")  # lock_enqueue_ttl = 2 s
    waiting = task.apply_async((run, run), queue=hold)  # nobody consumes it yet
    wait_for(lambda: _claim_keys(claims_worker, task, (run, run)) == [None] * 3, 10, "no claim")
    consume(claims_worker, hold)
    try:
        assert waiting.get(timeout=30)["token"]  # replaced by nothing: it ran
    finally:
        stop_consuming(claims_worker, hold)
    assert [r["id"] for r in claims_worker.records(run)] == [waiting.id]


def test_a_queued_message_whose_claim_names_another_task_is_superseded(claims_worker, run, hold):
    task = claims_worker.task("once_finished")
    waiting = task.apply_async((run, run), queue=hold)
    plan = plan_of(task)
    name = plan.keys.build((run, run), {})
    other = f"other-{run}"
    assert plan.redlock.claim_next(name, other, ttl=60, replace=True).claimant == other
    consume(claims_worker, hold)
    try:
        with pytest.raises(TaskRevokedError, match=f"superseded by task {other}"):
            waiting.get(timeout=30)
    finally:
        stop_consuming(claims_worker, hold)
        plan.redlock.withdraw_claim(name, other)
    assert claims_worker.records(run, phase=None) == []


def test_a_producer_on_other_nodes_is_named_at_error_and_its_task_runs(claims_worker, run):
    elsewhere = claims_worker.topology.url(14)  # the producer's one lock node
    env = dict(claims_worker.app.producer_env, CRL_NODES=elsewhere)
    producer = lockapp.app_from_env(env, main="elsewhere")
    claims_worker.topology.apps.append(producer)
    task = producer.tasks["lockapp.once_finished"]
    ours = plan_of(claims_worker.task("once_finished")).claimed_on
    theirs = plan_of(task).claimed_on
    assert theirs != ours and "@" in theirs and ":14" in theirs
    try:
        result = task.apply_async((run, run), {"duration": 0.1})
        assert result.get(timeout=30)["token"]  # run, not dropped
    finally:
        name = plan_of(task).keys.build((run, run), {})
        plan_of(task).redlock.withdraw_claim(name, result.id)

    def said() -> bool:
        with open(claims_worker.process.logfile) as log:
            return any(
                "ERROR" in line and theirs in line and ours in line
                for line in log
                if "claimed on other lock nodes" in line
            )

    wait_for(said, 10, "the worker's ERROR naming both places")


# -- retries, outages ------------------------------------------------------------------


def test_a_retry_keeps_its_claim(claims_worker, run):
    task = claims_worker.task("once_retry")
    first = task.apply_async((run, run))
    wait_for(lambda: first.state == states.RETRY, 20, "the task to retry")
    for _ in range(5):
        assert task.delay(run, run).id == first.id  # no second copy while the retry waits
    assert first.get(timeout=20) == "retried"
    runs = claims_worker.records(run)
    assert [(r["id"], r["retries"]) for r in runs] == [(first.id, 0), (first.id, 1)]


def test_a_majority_down_publishes_every_call_and_runs_it_later(claims_worker, run):
    task = claims_worker.task("once_outage")
    quorum = claims_worker.topology.quorum
    quorum.kill(0)
    quorum.kill(1)
    try:
        results = [task.apply_async((run, run), {"note": i}) for i in range(5)]
        assert len({r.id for r in results}) == 5  # every call published
        time.sleep(1.0)
        assert claims_worker.records(run) == []
    finally:
        quorum.restart(0)
        quorum.restart(1)
    for result in results:
        result.get(timeout=60)
    runs = claims_worker.records(run)
    assert sorted(r["note"] for r in runs) == [0, 1, 2, 3, 4]
    assert_no_overlap(runs)


# -- same-id copies and receipts ------------------------------------------------------------


@pytest.fixture(scope="module")
def redelivering_workers(topology: Topology, tmp_path_factory):
    """Two prefork workers whose broker redelivers an unacked message after 1 s."""
    conf = (
        '{"task_acks_late": true, "task_default_queue": "copies", "broker_transport_options":'
        ' {"visibility_timeout": 1, "unacked_restore_interval": 0.5}}'
    )
    env = dict(topology.env(7, 8), CRL_CONF=conf)
    logdir = str(tmp_path_factory.mktemp("copies"))
    procs = [
        harness.PreforkWorker(f"copies{i}", env, logdir, queues=["copies"], concurrency=1)
        for i in range(2)
    ]
    for proc in procs:
        proc.launch()
    try:
        for proc in procs:
            proc.await_ready()
        app = lockapp.app_from_env(env, main="copies-client")
        topology.apps.append(app)
        yield WorkerHandle("prefork", app, topology, procs[0])
    finally:
        for proc in procs:
            proc.stop(now=True)


def test_a_redelivered_copy_neither_runs_nor_rewrites_the_state(redelivering_workers, run):
    task = redelivering_workers.task("slow")
    result = task.apply_async((run, run), {"duration": 4.0})
    value = result.get(timeout=30)
    assert value["token"]
    time.sleep(2.0)  # copies redelivered meanwhile settle
    runs = redelivering_workers.records(run)
    assert [r["id"] for r in runs] == [result.id]
    assert result.state == states.SUCCESS and result.get(timeout=1) == value


def test_a_resent_id_that_already_succeeded_runs_again(claims_worker, run):
    """A new publish of a finished id is Celery's way to run it again: its receipt is
    read by copies only."""
    task = claims_worker.task("slow")
    first = task.apply_async((run, run), {"duration": 0.1})
    value = first.get(timeout=20)
    task.apply_async((run, run), {"duration": 0.1}, task_id=first.id)
    runs = wait_for(lambda: claims_worker.records(run)[1:] and claims_worker.records(run), 20)
    assert [r["id"] for r in runs] == [first.id, first.id]
    assert runs[0]["token"] == value["token"] < runs[1]["token"]


def test_with_idempotent_ids_a_resent_id_that_succeeded_does_not_run(claims_worker, run, hold):
    task = claims_worker.task("slow_idempotent")
    first = task.apply_async((run, run), {"duration": 0.1})
    value = first.get(timeout=20)
    task.apply_async((run, run), {"duration": 0.1}, task_id=first.id, queue=hold)
    assert queued(claims_worker.app, hold) == 1
    consume(claims_worker, hold)
    wait_for(lambda: queued(claims_worker.app, hold) == 0, 20, "the re-send to be taken")
    time.sleep(1.5)  # it would have run by now
    stop_consuming(claims_worker, hold)
    assert [r["id"] for r in claims_worker.records(run)] == [first.id]
    assert first.state == states.SUCCESS and first.get(timeout=1) == value


def take_back_unacked(app, queue: str) -> None:
    """Take the one message of ``queue`` without acknowledging it and close the channel:
    the broker puts it back flagged as redelivered (RabbitMQ's requeue; kombu's Redis
    transport restores its unacked messages when the channel closes)."""
    with app.connection_for_write() as conn:
        channel = conn.channel()
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None, f"no message in {queue}"
        channel.close()


def test_a_redelivered_copy_of_a_finished_id_does_not_run(claims_worker, run, hold):
    task = claims_worker.task("slow")
    first = task.apply_async((run, run), {"duration": 0.1})
    value = first.get(timeout=20)
    task.apply_async((run, run), {"duration": 0.1}, task_id=first.id, queue=hold)
    take_back_unacked(claims_worker.app, hold)
    wait_for(lambda: queued(claims_worker.app, hold) == 1, 20, "the message to be put back")
    consume(claims_worker, hold)
    wait_for(lambda: queued(claims_worker.app, hold) == 0, 20, "the copy to be taken")
    time.sleep(1.5)  # it would have run by now
    stop_consuming(claims_worker, hold)
    assert [r["id"] for r in claims_worker.records(run)] == [first.id]
    assert first.state == states.SUCCESS and first.get(timeout=1) == value


def test_a_frozen_chord_applied_twice_runs_its_body_twice(claims_worker, run):
    """Celery re-runs the same task ids: neither the header nor the body is a copy."""
    slow, collect = claims_worker.task("slow"), claims_worker.task("collect")
    header = [slow.s(f"{run}-{i}", run, 0.05) for i in range(2)]
    sig = chord(header, collect.s(run))
    sig.freeze()
    sig.apply_async().get(timeout=30)
    wait_for(lambda: len(claims_worker.records(run, "collect")) == 1, 20, "the first body")
    sig.apply_async()
    wait_for(lambda: len(claims_worker.records(run, "collect")) == 2, 30, "the second body")
    bodies = claims_worker.records(run, "collect")
    assert bodies[0]["id"] == bodies[1]["id"]
    assert bodies[1]["token"] > bodies[0]["token"]
    assert len(claims_worker.records(run)) == 4  # each header task ran twice


def test_a_flat_chord_with_a_dropped_part_fails(claims_worker, run):
    """A dropped call that is itself a part of a chord's header is counted by the chord,
    which fails at once instead of waiting for its timeout."""
    slow, collect = claims_worker.task("slow"), claims_worker.task("collect")
    result = chord([slow.s(run, run, 2.0) for _ in range(2)], collect.s(run)).apply_async()
    with pytest.raises((ChordError, TaskRevokedError), match="duplicate"):
        result.get(timeout=30)
    wait_for(lambda: claims_worker.records(run), 20, "the part that ran to end")
    assert len(claims_worker.records(run, "start")) == 1
    assert claims_worker.records(run, "collect") == []


# -- eager mode ------------------------------------------------------------------------


def test_eager_apply_holds_the_claim_around_the_call(claims_worker, run):
    task = claims_worker.task("once_finished")
    result = task.apply((run, run), {"duration": 0.0})
    assert result.successful(), result.traceback
    assert claimant(claims_worker, task, (run, run)) is None
    queued_id = task.apply_async((run, run), {"duration": 0.5}, countdown=1).id
    returned = task.apply((run, run), {"duration": 0.0})
    assert returned.id == queued_id  # the queued task is already on its way
    task.AsyncResult(queued_id).get(timeout=20)
