"""Several real ``celery beat`` processes over real redis-server nodes: every slot once.

Each beat is ``python -m celery -A beat_app.proj beat -S
celery_redlock.beat:RedlockScheduler`` with its own schedule file, configured by
environment variables (see ``beat_app/proj.py``). The broker is a private Redis
node; what the beats dispatched is read back from its ``celery`` list (kombu's
JSON envelope: the headers carry the entry name, the slot and the message id).
A second list of three nodes is the Redlock quorum, which the tests kill, pause
and restart.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from celery_redlock.testing import RedisClusters, RedisNodes
from tests.support.celery_headers import BEAT_HEADERS
from tests.support.kinds import params

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
STOP_TIMEOUT = 5.0


class Msg(NamedTuple):
    entry: str
    slot: str
    id: str
    task: str


class Beat:
    """One ``celery beat`` subprocess and its log file."""

    def __init__(self, index: int, env: dict, tmp: Path, loglevel: str = "info"):
        self.log_path = tmp / f"beat-{index}.log"
        self.started_at: float | None = None
        self.terminated = False
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "beat_app.proj",
                    "beat",
                    "-S",
                    "celery_redlock.beat:RedlockScheduler",
                    "--schedule",
                    str(tmp / f"schedule-{index}"),
                    "-l",
                    loglevel,
                ],
                env=env,
                cwd=str(tmp),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.pid = self.proc.pid

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_started(self, timeout: float = 20.0) -> float:
        """Wait for ``beat: Starting...``: the scheduler and its entries are made right after."""
        deadline = time.monotonic() + timeout
        while "beat: Starting..." not in self.log:
            if self.proc.poll() is not None:
                raise AssertionError(f"beat {self.pid} exited:\n{self.log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"beat {self.pid} did not start:\n{self.log}")
            time.sleep(0.02)
        self.started_at = time.time()
        return self.started_at

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()

    def terminate(self) -> None:
        """SIGTERM, once: beat saves its schedule and exits (a second one would interrupt that)."""
        if self.proc.poll() is None and not self.terminated:
            self.terminated = True
            os.kill(self.pid, signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        self.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()

    def errors(self) -> list[str]:
        return [line for line in self.log.splitlines() if ": ERROR/" in line or "Traceback" in line]


class Rig:
    """Three Redlock nodes, a broker node, and the beats started on them."""

    def __init__(self, make_nodes: Callable[..., RedisNodes | RedisClusters], tmp: Path):
        self.nodes = make_nodes(3)
        self.broker = make_nodes(1)[0]
        self.tmp = tmp
        self.beats: list[Beat] = []

    def start(self, entries: str, node_timeout: float = 0.15, loglevel: str = "info") -> Beat:
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
            CRL_BEAT_BROKER=self.broker.url,
            CRL_BEAT_NODES=",".join(self.nodes.urls),
            CRL_BEAT_ENTRIES=entries,
            # The default 50 ms is for a quiet host; on a loaded 2-core CI box a
            # process stall can exceed it and look like an outage.
            CRL_BEAT_NODE_TIMEOUT=str(node_timeout),
        )
        beat = Beat(len(self.beats), env, self.tmp, loglevel)
        self.beats.append(beat)
        return beat

    def stop(self) -> float:
        """Stop every beat; returns when the first was told to."""
        stopped = time.time()
        for beat in self.beats:  # signal all first: their shutdowns overlap
            beat.terminate()
        for beat in self.beats:
            beat.stop()
        return stopped

    def dispatched(self) -> list[Msg]:
        with self.broker.client() as client:
            raw = client.lrange("celery", 0, -1)
        out = []
        for item in reversed(raw):  # LPUSH: oldest last
            headers = json.loads(item)["headers"]
            # exactly what the installed Celery's beat sends (none before 5.6)
            assert headers.get("celery_beat_task") == BEAT_HEADERS.get("celery_beat_task")
            out.append(
                Msg(
                    headers["beat_entry"],
                    headers["redlock_beat_slot"],
                    headers["id"],
                    headers["task"],
                )
            )
        return out

    def unsent_claims(self, msgs: list[Msg]) -> dict[tuple[str, str], str]:
        """Slot claims held on a quorum whose message never reached the broker:
        ``(entry, slot) -> claim value``."""
        sent = {(m.entry, m.slot) for m in msgs}
        seen: dict[tuple[str, str], list[str]] = {}
        for node in self.nodes:
            with node.client() as client:
                for key in client.scan_iter("redlock:beat:*"):
                    _, _, entry, slot = key.split(":")
                    seen.setdefault((entry, slot), []).append(client.get(key))
        return {
            slot: values[0]
            for slot, values in seen.items()
            if slot not in sent and len(values) >= 2 and len(set(values)) == 1
        }

    def claims(
        self, msgs: list[Msg], node_indexes: tuple[int, ...] = (0, 1, 2)
    ) -> dict[Msg, list[str]]:
        """Per message, the claim values the given nodes hold for its slot."""
        out: dict[Msg, list[str]] = {msg: [] for msg in msgs}
        for index in node_indexes:
            with self.nodes[index].client() as client:  # a node's or a cluster's client
                values = [client.get(f"redlock:beat:{m.entry}:{m.slot}") for m in msgs]
            for msg, value in zip(msgs, values):
                if value is not None:
                    out[msg].append(value)
        return out


@pytest.fixture
def rig(request, redis_node_factory, tmp_path) -> Iterator[Rig]:
    rig = Rig(redis_node_factory, tmp_path)
    try:
        yield rig
    finally:
        rig.stop()
        if getattr(request.node, "failed", False):
            print_logs(rig)


def print_logs(rig: Rig) -> None:
    """What each beat did and when, for a failure seen only in a CI log."""
    for beat in rig.beats:
        print(f"--- beat {beat.pid}")
        for line in beat.log.splitlines():
            if "Sending due task" in line or "slot" in line or "/WARNING" in line:
                print(line)


@pytest.fixture(**params(lambda s: s.count == 3 and not s.local and s.id != "3masters"))
def kind_rig(request, redis_node_factory, tmp_path) -> Iterator[Rig]:
    """The rig with the session's three nodes of another kind as the lock nodes: Redis
    Clusters of three masters each, PostgreSQL servers, or etcd clusters (the broker
    stays Redis)."""
    nodes = request.getfixturevalue(request.param)
    rig = Rig(lambda n: nodes if n == 3 else redis_node_factory(n), tmp_path)
    try:
        yield rig
    finally:
        rig.stop()
        if getattr(request.node, "failed", False):
            print_logs(rig)


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def slots_of(msgs: list[Msg], entry: str) -> list[float]:
    return sorted(float(m.slot) for m in msgs if m.entry == entry)


def assert_each_slot_once(
    msgs: list[Msg],
    entry: str,
    period: float,
    covered: tuple[float, float],
    min_expected: int = 3,
    excused: frozenset[float] = frozenset(),
) -> list[float]:
    """No slot twice; every slot of the ``covered`` window (two beats ticking) sent.

    Every beat runs an interval entry as each cell of the epoch grid begins,
    whatever the latency of its claims; completeness is checked where at least
    two were running. The callers end ``covered`` a second or more before the
    stop: on a loaded host a tick may send its slot most of a second late.
    ``excused`` slots may be missing (a killed beat's last claim).
    """
    counts = Counter(m.slot for m in msgs if m.entry == entry)
    dupes = {slot: n for slot, n in counts.items() if n > 1}
    assert not dupes, f"{entry}: slots sent more than once: {dupes}"
    slots = slots_of(msgs, entry)
    assert all(s % period == 0 for s in slots), f"{entry}: slots off the epoch grid: {slots}"
    lo, hi = covered
    expected = [k * period for k in range(math.ceil(lo / period), math.floor(hi / period) + 1)]
    assert len(expected) >= min_expected, f"{entry}: window {covered} too short"
    missing = sorted(set(expected) - set(slots) - excused)
    assert not missing, (
        f"{entry}: slots {missing} of {expected[0]:.0f}..{expected[-1]:.0f} never sent"
    )
    return slots


def assert_claims_name_the_messages(
    rig: Rig, msgs: list[Msg], nodes: tuple[int, ...] = (0, 1, 2)
) -> None:
    """Each sent slot is claimed on a quorum, by the message's id, with host and pid."""
    pids = {str(beat.pid) for beat in rig.beats}
    for msg, values in rig.claims(msgs, nodes).items():
        ours = [v for v in values if v.startswith(msg.id + "|")]
        assert len(ours) >= 2, f"{msg}: claims {values}"
        assert ours[0].rsplit("|", 1)[1] in pids


def test_two_beats_started_apart_send_every_slot_once(rig):
    entries = (
        "every-1s=every:1,every-2s=every:2@beat_app.elsewhere,aligned-3s=aligned:3,cron=cron:*"
    )
    first = rig.start(entries)
    t0 = first.wait_started()
    time.sleep(1.3)
    second = rig.start(entries)
    t1 = second.wait_started()
    sleep_until(t1 + 10.0)  # from the last start: a loaded host starts beats slowly
    stopped = rig.stop()

    msgs = rig.dispatched()
    every1 = assert_each_slot_once(msgs, "every-1s", 1, (t1 + 1, stopped - 1.3))
    assert_each_slot_once(msgs, "every-2s", 2, (t1 + 2, stopped - 2.3), min_expected=2)
    assert_each_slot_once(msgs, "aligned-3s", 3, (t1, stopped - 1.3), min_expected=2)
    assert {m.task for m in msgs if m.entry == "every-2s"} == {"beat_app.elsewhere"}  # send_task
    # The crontab entry: each beat first finds it due at the next minute boundary.
    cron = Counter(m.slot for m in msgs if m.entry == "cron")
    assert all(n == 1 for n in cron.values()), cron
    boundary = math.ceil(t0 / 60) * 60
    if t0 + 0.5 < boundary < stopped - 1.0:
        assert cron == {str(boundary): 1}
    # Both beats were live, and each says "Sending due task" only for what it sent:
    # a beat that lost a slot says it skipped it, and which beat sent it (never
    # itself: a slot is claimed once per beat). Which beat wins is a race, run
    # as each cell begins: one may lose every slot.
    senders = Counter(values[0].rsplit("|", 1)[1] for values in rig.claims(msgs).values())
    skips = 0
    for beat, other in ((first, second), (second, first)):
        assert beat.log.count("Scheduler: Sending due task") == senders[str(beat.pid)]
        skipped = [line for line in beat.log.splitlines() if "beat: skipped slot" in line]
        assert all(f" pid {other.pid} (task " in line for line in skipped), skipped
        assert senders[str(beat.pid)] + len(skipped) >= 5, f"beat {beat.pid} took no part"
        skips += len(skipped)
    assert skips > 0
    assert_claims_name_the_messages(rig, msgs)
    assert not first.errors() and not second.errors()
    print(
        f"\ntwo beats: {len(msgs)} messages, every-1s slots {every1[0]:.0f}..{every1[-1]:.0f}, "
        f"cron {dict(cron)}"
    )


def test_three_beats_one_killed_mid_run_no_gap_no_duplicate(rig):
    entries = "every-1s=every:1,every-2s=every:2,aligned-3s=aligned:3"
    beats = []
    for pause in (0.9, 0.8, 0.0):
        beats.append(rig.start(entries))
        beats[-1].wait_started()
        time.sleep(pause)
    t2 = beats[-1].started_at
    sleep_until(t2 + 4.0)  # from the last start: a loaded host starts beats slowly
    # Kill the beat that sent the most slots so far: its absence must not show.
    senders = Counter(
        values[0].rsplit("|", 1)[1] for values in rig.claims(rig.dispatched()).values() if values
    )
    victim = next(b for b in beats if str(b.pid) == senders.most_common(1)[0][0])
    killed_at = time.time()
    victim.kill()
    sleep_until(killed_at + 7.0)
    stopped = rig.stop()

    msgs = rig.dispatched()
    # At most once: a beat killed between its claim and its publish (one round
    # trip) takes that slot with it, and the others skip it. Only slots the
    # victim claimed at the moment it was killed may be missing.
    unsent = rig.unsent_claims(msgs)
    assert all(value.endswith(f"|{victim.pid}") for value in unsent.values()), unsent
    assert all(abs(float(slot) - killed_at) < 3.5 for _, slot in unsent), (unsent, killed_at)
    assert all(n == 1 for n in Counter(e for e, _ in unsent).values()), unsent  # one per entry

    def excused(entry: str) -> frozenset[float]:
        return frozenset(float(slot) for e, slot in unsent if e == entry)

    every1 = assert_each_slot_once(
        msgs, "every-1s", 1, (t2 + 1, stopped - 1.3), excused=excused("every-1s")
    )
    assert_each_slot_once(
        msgs, "every-2s", 2, (t2 + 2, stopped - 2.3), min_expected=2, excused=excused("every-2s")
    )
    assert_each_slot_once(
        msgs, "aligned-3s", 3, (t2, stopped - 1.3), min_expected=2, excused=excused("aligned-3s")
    )
    claims = rig.claims(msgs)
    by_victim = [
        m for m, values in claims.items() if values and values[0].endswith(f"|{victim.pid}")
    ]
    assert by_victim and all(float(m.slot) < killed_at + 1 for m in by_victim)
    assert_claims_name_the_messages(rig, msgs)
    assert not any(b.errors() for b in beats if b is not victim)
    print(
        f"\nthree beats, pid {victim.pid} killed after sending {len(by_victim)}: "
        f"{len(msgs)} messages, every-1s slots {every1[0]:.0f}..{every1[-1]:.0f}"
    )


def test_a_beat_told_to_stop_mid_claim_publishes_the_slot_first(rig):
    # A hung node makes each claim round last the whole node timeout (1 s):
    # the SIGTERM lands inside the round, between the claim and its publish.
    beat = rig.start("every-1s=every:1", node_timeout=1.0, loglevel="debug")
    beat.wait_started()
    rig.nodes.pause(2)
    due = beat.log.count("beat: claiming slot")
    deadline = time.monotonic() + 10
    while beat.log.count("beat: claiming slot") == due:
        assert time.monotonic() < deadline, beat.log
        time.sleep(0.005)
    time.sleep(0.1)  # inside the claim round, which waits 1 s for the hung node
    beat.terminate()
    beat.proc.wait(STOP_TIMEOUT)
    rig.nodes.resume(2)
    msgs = rig.dispatched()
    assert rig.unsent_claims(msgs) == {}  # no slot claimed and left unsent
    # Said once the slot was won, before its publish: a claim that never ends
    # in a publish (the bug) would leave "claiming" without "Sending".
    assert len(msgs) == beat.log.count("Sending due task") == due + 1, beat.log


def test_a_minority_of_nodes_down_or_hung_changes_nothing(rig):
    entries = "every-1s=every:1,aligned-2s=aligned:2"
    first = rig.start(entries)
    first.wait_started()
    time.sleep(0.7)
    second = rig.start(entries)
    t1 = second.wait_started()  # the faults are timed from the last start
    sleep_until(t1 + 1.3)
    rig.nodes.kill(0)  # refuses connections
    sleep_until(t1 + 4.3)
    rig.nodes.restart(0)  # back, empty
    # One fault at a time: a node that restarted empty and a hung node at the
    # same moment is two faults for the core (the restarted node's script
    # fallback gets no time left once the hung node used up the deadline).
    sleep_until(t1 + 5.8)
    rig.nodes.pause(2)  # accepts connections, never answers: each claim waits node_timeout
    sleep_until(t1 + 7.3)
    rig.nodes.resume(2)
    sleep_until(t1 + 9.8)
    stopped = rig.stop()

    msgs = rig.dispatched()
    # A tick near a fault (a hung node, or one just resumed and answering its
    # backlog) may wait out a node timeout on each round, so on a loaded host
    # a slot can go out most of a second late: completeness is checked up to
    # 1.5 s before the stop, which leaves the last slot after the resume.
    # While node 2 hangs, every claim waits out the node timeout: the runs are late
    # by that much, never by a cell (each is due as its cell begins).
    every1 = assert_each_slot_once(msgs, "every-1s", 1, (t1 + 1, stopped - 1.5))
    assert_each_slot_once(msgs, "aligned-2s", 2, (t1, stopped - 1.5))
    assert not first.errors() and not second.errors()
    assert "quorum unavailable" not in first.log + second.log
    print(
        f"\nminority down: {len(msgs)} messages, every-1s slots {every1[0]:.0f}..{every1[-1]:.0f}"
    )


def test_a_majority_of_nodes_down_holds_slots_back_and_resumes(rig):
    entries = "every-1s=every:1,aligned-6s=aligned:6"
    first = rig.start(entries)
    first.wait_started()
    time.sleep(0.5)
    second = rig.start(entries)
    t1 = second.wait_started()
    # An outage around an aligned-6s boundary G: every beat finds G due while
    # the majority is down, holds it back, and one sends it once nodes return.
    boundary = (math.floor(time.time() / 6) + 1) * 6
    if boundary - time.time() < 1.5:
        boundary += 6
    sleep_until(boundary - 0.7)
    down_from = time.time()
    rig.nodes.kill(0)
    rig.nodes.kill(1)
    dead_from = time.time()  # a loaded host may take a while to kill
    if dead_from > boundary - 0.2:
        boundary += 6  # not surely down at G: the next boundary is the one held back
    sleep_until(boundary + 2.0)
    back_from = time.time()
    rig.nodes.restart(0)
    rig.nodes.restart(1)
    down_until = time.time()
    sleep_until(boundary + 6.5)
    stopped = rig.stop()

    msgs = rig.dispatched()
    logs = first.log + second.log
    # The held-back slot: sent once, after the nodes came back, while still due.
    aligned = Counter(m.slot for m in msgs if m.entry == "aligned-6s")
    assert aligned[str(boundary)] == 1, aligned
    assert all(n == 1 for n in aligned.values()), aligned
    assert f"slot {boundary} of entry 'aligned-6s' NOT sent" in logs
    assert f"sending held-back slot {boundary} of entry 'aligned-6s'" in logs
    # every-1s: never twice; slots that began and ended while both nodes were surely
    # down (killed, not yet restarting) were never sent (no claim, no publish) and
    # are reported as such.
    counts = Counter(m.slot for m in msgs if m.entry == "every-1s")
    assert all(n == 1 for n in counts.values()), counts
    lost = [s for s in range(math.ceil(dead_from), math.floor(back_from)) if s + 1 <= back_from]
    assert lost and not [s for s in lost if str(s) in counts]
    assert any(f"slot {s} of entry 'every-1s' was NOT sent" in logs for s in lost)
    assert "ERROR/MainProcess] beat: Redlock quorum unavailable" in logs
    # Before and after the outage: every slot, once.
    assert_each_slot_once(
        [m for m in msgs if float(m.slot) < down_from - 1],
        "every-1s",
        1,
        (t1 + 1, down_from - 1.3),
        min_expected=0,
    )
    assert_each_slot_once(
        [m for m in msgs if float(m.slot) >= down_until],
        "every-1s",
        1,
        (down_until + 0.3, stopped - 1.3),
    )
    assert_claims_name_the_messages(rig, [m for m in msgs if float(m.slot) >= down_until])
    assert "Traceback" not in logs
    print(
        f"\nmajority down {down_from:.1f}..{down_until:.1f}: {len(msgs)} messages, "
        f"slots never sent {lost}, aligned-6s {dict(aligned)}"
    )


def test_two_beats_on_three_nodes_of_another_kind_send_every_slot_once(kind_rig):
    """Each lock node a Redis Cluster (a slot's claim goes to the shard of its key) or
    a PostgreSQL server (the claim is a row; its node timeout is the 500 ms its page
    advises)."""
    timeout = 0.5 if "postgres" in str(kind_rig.nodes.urls[0]) else 0.15
    first = kind_rig.start("every-1s=every:1", node_timeout=timeout)
    first.wait_started()
    second = kind_rig.start("every-1s=every:1", node_timeout=timeout)
    t1 = second.wait_started()
    sleep_until(t1 + 6.0)
    stopped = kind_rig.stop()
    msgs = kind_rig.dispatched()
    assert_each_slot_once(msgs, "every-1s", 1, (t1 + 1, stopped - 1.3))
    assert_claims_name_the_messages(kind_rig, msgs)
    assert not first.errors() and not second.errors()
