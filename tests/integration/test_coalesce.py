"""Debounce and throttle per key, across producer processes, on a real prefork worker.

Every call records when it was made and its ``note``; every run records its
start and the ``note`` it ran with (see ``lockapp``).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time

import pytest
from celery.exceptions import TaskRevokedError

from celery_redlock import plan_of, result_of, superseded_by
from celery_redlock.core import ping
from tests.support import harness, lockapp
from tests.support.harness import Topology, WorkerHandle, assert_no_overlap, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

QUEUE = "coalesce"


def worker_env(topology: Topology) -> dict[str, str]:
    """The worker's and the producers' app: broker DB 9, results DB 10, queue ``coalesce``."""
    return dict(topology.env(9, 10), CRL_CONF=json.dumps({"task_default_queue": QUEUE}))


@pytest.fixture(scope="module")
def coalesce_worker(topology: Topology, tmp_path_factory, pytestconfig):
    harness.WORKER_LOGS.register(pytestconfig)
    env = worker_env(topology)
    logdir = str(tmp_path_factory.mktemp("coalesce"))
    proc = harness.PreforkWorker("coalesce", env, logdir, queues=[QUEUE], concurrency=4).start()
    app = lockapp.app_from_env(env, main="coalesce-client")
    topology.apps.append(app)
    try:
        yield WorkerHandle("prefork", app, topology, proc)
    finally:
        proc.stop(now=True)


@pytest.fixture(autouse=True)
def _nothing_left_without_a_ttl(topology: Topology):
    """After every test: no lock key, and every claim, burst and throttle key expires."""
    yield
    topology.assert_no_lock_keys()
    topology.assert_every_key_expires("claim", "burst", "throttle", "receipt")


class Unclaimed(logging.Handler):
    """The ids of the calls a producer published without a claim: its claim round
    had no answer in time (a loaded host past the node timeout), so the call runs
    as published, by design (see enqueue._coalesce)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if "could not plan" in record.msg:
            self.ids.add(record.args[1])


def _call_on_schedule(env, name, key, run, times, notes, out):
    """Call at each of ``times`` (time.time()), with the matching note; report
    (time, note, id, published without a claim)."""
    app = lockapp.app_from_env(env, main="producer")
    task = app.tasks[name]
    unclaimed = Unclaimed()
    logging.getLogger("celery_redlock.enqueue").addHandler(unclaimed)
    # the process's connections (a ZooKeeper session) opened before the burst: a call
    # whose claim round waits on a session opening on a loaded host publishes unclaimed
    ping(plan_of(task).redlock)
    sent = []
    for at, note in zip(times, notes):
        time.sleep(max(0.0, at - time.time()))
        result = task.apply_async((key, run), {"note": note})
        sent.append((time.time(), note, result.id))
    out.put([(*call, call[2] in unclaimed.ids) for call in sent])


def call_from_processes(handle, name, key, run, plan):
    """``plan``: a list of (time, note) per producer process. Every call, in time
    order, as (time, note, id, published without a claim)."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    env = worker_env(handle.topology)
    procs = [
        ctx.Process(
            target=_call_on_schedule,
            args=(env, name, key, run, [t for t, _ in calls], [n for _, n in calls], out),
        )
        for calls in plan
    ]
    for p in procs:
        p.start()
    sent = sorted(c for _ in procs for c in out.get(timeout=60))
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return sent


def test_debounce_runs_once_after_the_burst_with_the_last_arguments(coalesce_worker, run):
    t0 = time.time() + 0.5
    # 30 calls over 2 s from 3 processes, interleaved 66 ms apart.
    plan = [[(t0 + (3 * i + p) * 0.066, f"{p}-{i}") for i in range(10)] for p in range(3)]
    sent = call_from_processes(coalesce_worker, "lockapp.debounced", run, run, plan)
    last_at, last_note, last_id, _ = sent[-1]

    def ran() -> bool:
        return last_note in [r["note"] for r in coalesce_worker.records(run)]

    wait_for(ran, 10, "the debounced run")
    time.sleep(1.5)  # quiet: nothing else runs
    runs = coalesce_worker.records(run)
    # The last call runs, once, and no call it replaced. A call whose claim round had
    # no answer in time (a loaded host past the node timeout; its producer logged it)
    # was published unclaimed and runs too, by design; if its claim landed all the
    # same, the claimed call it replaced does not run.
    notes = [r["note"] for r in runs]
    unclaimed = {note for _, note, _, blind in sent if blind}
    claimed = [call for call in sent if not call[3]]
    assert len(set(notes)) == len(notes) and last_note in notes, (notes, unclaimed)
    assert set(notes) <= unclaimed | {call[1] for call in claimed[-1:]}, (notes, unclaimed)
    last = next(r for r in runs if r["note"] == last_note)
    assert last["id"] == last_id
    # due 1 s after the last call (which began at its planned time and had returned
    # by last_at), and not started before that; how late a loaded host then delivers
    # the ETA message is Celery's (3.7 s and 5.4 s seen beside busy loops)
    planned = {note: at for calls in plan for at, note in calls}
    earliest = planned[last_note] + 1.0 - 0.01
    if last["retries"] == last["attempt"] == 0 and last_note not in unclaimed:
        due = last["eta"]
        assert earliest <= due <= last_at + 1.0 + 0.01, (due, last_at)
        assert last["start"] >= due - 0.01, (last["start"], due)
    else:  # it met a lock outage when due (a loaded host's node timeout): its ETA is the
        # retry's or the re-published message's
        assert last["start"] >= earliest, (last["start"], earliest)
    if not unclaimed:
        replaced = coalesce_worker.app.AsyncResult(sent[0][2])
        with pytest.raises(TaskRevokedError, match="superseded by task"):
            replaced.get(timeout=5)
        assert superseded_by(replaced).id == last_id


def test_result_of_a_debounced_call_is_the_run_that_replaced_it(coalesce_worker, run):
    task = coalesce_worker.task("debounced")
    calls = [task.apply_async((run, run), {"note": note}) for note in range(3)]
    last = calls[-1]
    value = last.get(timeout=20)
    assert value["token"] > 0
    for call in calls[:-1]:
        with pytest.raises(TaskRevokedError, match="superseded by task"):
            call.get(timeout=5)
        followed = result_of(call)
        assert followed.id == last.id
        assert followed.get(timeout=5) == value
    assert result_of(last) is last  # not superseded: itself
    assert [r["note"] for r in coalesce_worker.records(run)] == [2]


def test_debounce_max_caps_how_long_a_burst_waits(coalesce_worker, run):
    t0 = time.time() + 0.3
    plan = [[(t0 + 0.3 * i, i) for i in range(17)]]  # every 0.3 s for 5 s
    sent = call_from_processes(coalesce_worker, "lockapp.debounced_capped", run, run, plan)

    def ended() -> list:
        """The runs, once the one with the last call's arguments started."""
        runs = sorted(coalesce_worker.records(run), key=lambda r: r["start"])
        return runs if runs and runs[-1]["note"] == sent[-1][1] else []

    runs = wait_for(ended, 30, "the run of the burst's end")
    # Each run is due at most 2 s after the first call of its burst (the first call
    # after the previous run started; uncapped, 5 s), unless its own call came later
    # still (a loaded host delivered the previous run late, and calls that found the
    # cap passed are due at once: no ETA); and it starts no sooner. How late a loaded
    # host delivers a message is Celery's, not the cap's: the message's ETA is the
    # due time the schedule computed. (A quiet host runs the burst two or three
    # times; a loaded one can deliver each call due at once later than the next call,
    # 0.3 s on, which replaces it: then one run, due at once, still checked here.)
    sent_at = {c[2]: c[0] for c in sent}
    starts = [sent[0][0]] + [r["start"] for r in runs]
    for previous, r in zip(starts, runs):
        first_of_burst = min(c[0] for c in sent if c[0] >= previous)
        due = sent_at[r["id"]] if r["eta"] is None else r["eta"]
        if r["eta"] is None:  # due at once: only a call that found the cap passed (its
            # burst's first call was sent, as the producer saw it, up to 1 s after the
            # nodes recorded it on a loaded host)
            assert due >= first_of_burst + 2.0 - 1.0, (r, first_of_burst)
        assert due <= max(first_of_burst + 2.0, sent_at[r["id"]]) + 0.01, (r, first_of_burst)
        assert r["start"] >= due - 0.01, r
    for r in runs:  # each ran with the newest arguments at its grant: none older than
        # the last call sent 0.05 s before its lock round began (its start less its
        # round; a loaded host may take a while from that round to the body)
        began = r["start"] - r["round"]
        newest = max((c for c in sent if c[0] <= began - 0.05), key=lambda c: c[0])
        assert r["note"] >= newest[1], (r["note"], newest)
    assert runs[-1]["note"] == sent[-1][1]  # the end of the burst is not lost
    assert_no_overlap(runs)


def test_throttle_starts_at_most_once_per_period(coalesce_worker, run):
    t0 = time.time() + 0.3
    plan = [[(t0 + 0.06 * i, i) for i in range(50)]]  # 50 calls over 3 s
    sent = call_from_processes(coalesce_worker, "lockapp.throttled", run, run, plan)

    def ended() -> list:
        """The runs, once the trailing one (with the last call's arguments) started."""
        runs = sorted(coalesce_worker.records(run), key=lambda r: r["start"])
        return runs if runs and runs[-1]["note"] == sent[-1][1] else []

    runs = wait_for(ended, 30, "the trailing run")
    # the first at once: on its first delivery, not put off by the throttle
    assert runs[0]["note"] == 0 and runs[0]["attempt"] == 0, runs[0]
    starts = [r["start"] for r in runs]
    # Grants are at least 1 s apart on the granting clock, and each comes within
    # its round: a start follows the previous round's beginning (its start less
    # its round, see lockapp.round_age) by a second at least, however long a
    # loaded host took from that grant to that body (0.5 s seen). Unthrottled,
    # these calls would start 60 ms apart.
    began = [r["start"] - r["round"] for r in runs]
    assert all(b - a >= 1.0 - 0.05 for a, b in zip(began, starts[1:])), (starts, began)
    # a leading run, one in the burst, the trailing one (how many more, a loaded host's
    # late deliveries decide; the spacing above is what the throttle bounds)
    assert len(runs) >= 3, starts
    assert runs[-1]["note"] == sent[-1][1]  # the trailing run has the last call's arguments


def test_two_keys_debounce_independently(coalesce_worker, run):
    task = coalesce_worker.task("debounced")
    for i in range(5):
        task.delay(f"{run}-a", run, note=f"a{i}")
        task.delay(f"{run}-b", run, note=f"b{i}")
        time.sleep(0.1)
    wait_for(lambda: len(coalesce_worker.records(run)) >= 2, 10, "both keys to run")
    time.sleep(1.2)
    assert sorted(r["note"] for r in coalesce_worker.records(run)) == ["a4", "b4"]


def test_a_minority_down_mid_burst_changes_nothing(coalesce_worker, run):
    task = coalesce_worker.task("debounced")
    quorum = coalesce_worker.topology.quorum
    ids = []
    try:
        for i in range(8):
            if i == 4:
                quorum.kill(2)
            ids.append(task.delay(run, run, note=i).id)
            time.sleep(0.1)
        wait_for(lambda: coalesce_worker.records(run), 10, "the debounced run")
        time.sleep(1.2)
    finally:
        quorum.restart(2)
    assert [(r["id"], r["note"]) for r in coalesce_worker.records(run)] == [(ids[-1], 7)]


def test_a_call_replaced_at_publish_meets_an_outage_and_stays_revoked(coalesce_worker, run):
    """A debounced call that the next one replaced is REVOKED at once, naming it.
    When its message comes due while most lock nodes are down, the worker drops
    it on that record (no RETRY lands over the REVOKED: its result keeps naming
    the run that replaced it), and the later call runs once the nodes are back."""
    task = coalesce_worker.task("debounced")
    quorum = coalesce_worker.topology.quorum
    first = task.delay(run, run, note=0)
    last = task.delay(run, run, note=1)
    assert superseded_by(first).id == last.id
    quorum.kill(0)
    quorum.kill(1)
    try:
        # both come due 1 s after their call; the first meets no quorum
        wait_for(lambda: delivered(coalesce_worker, first.id), 30, "the first's delivery", 0.1)
    finally:
        quorum.restart(0)
        quorum.restart(1)
    assert "dropped: superseded by task " + last.id in delivered(coalesce_worker, first.id)
    assert result_of(first).id == last.id
    assert last.get(timeout=60)["token"] > 0
    assert [r["note"] for r in coalesce_worker.records(run)] == [1]


def delivered(worker: WorkerHandle, task_id: str) -> str:
    """The worker's log line that ended a delivery of ``task_id`` (its drop, or its
    retry: "lock nodes unavailable, retry"), or ""."""
    with open(worker.process.logfile) as f:
        for line in f:
            if task_id in line and ("dropped: " in line or "unavailable, retry" in line):
                return line
    return ""


def test_a_majority_down_publishes_every_call(coalesce_worker, run, caplog):
    task = coalesce_worker.task("debounced")
    quorum = coalesce_worker.topology.quorum
    quorum.kill(0)
    quorum.kill(1)
    try:
        with caplog.at_level(logging.WARNING, logger="celery_redlock.enqueue"):
            results = [task.delay(run, run, note=i) for i in range(4)]
        assert sum("could not plan" in r.getMessage() for r in caplog.records) == 4
        time.sleep(1.5)
    finally:
        quorum.restart(0)
        quorum.restart(1)
    for result in results:
        result.get(timeout=60)
    runs = coalesce_worker.records(run)
    assert sorted(r["note"] for r in runs) == [0, 1, 2, 3]
    assert_no_overlap(runs)
