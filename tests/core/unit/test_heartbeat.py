"""The heartbeat (celery_redlock.heartbeat): rounds, loss, batching, the thread, fork.

Every test runs twice: on fakeredis servers through the Redis kind, and on
memory nodes (``memory://``)."""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
import weakref

import fakeredis
import pytest

from celery_redlock.core import heartbeat
from celery_redlock.core.heartbeat import THREAD_NAME, Heartbeat
from celery_redlock.core.held import FREED
from celery_redlock.exceptions import LockLost, QuorumUnavailable
from celery_redlock.redlock import Redlock
from celery_redlock.testing.memory import MemoryNode, MemoryNodes

TTL = 10.0
#: What a fresh lease (or one renewed now) has left: ttl - drift (1 %) - 2 ms.
VALID = TTL - TTL * 0.01 - 0.002


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


#: The nodes :func:`cluster` makes: ``fakeredis`` or ``memory`` (set by :func:`nodes_of`).
NODES = ["fakeredis"]


@pytest.fixture(autouse=True, params=["fakeredis", "memory"])
def nodes_of(request):
    NODES[0] = request.param
    yield request.param
    NODES[0] = "fakeredis"


def cluster(clock=time.monotonic, n: int = 3) -> tuple[Redlock, list]:
    """A Redlock over ``n`` independent fake servers (or memory nodes)."""
    if NODES[0] == "memory":
        nodes = MemoryNodes(n)
        return Redlock(nodes.urls, clock=clock, node_timeout=1.0), list(nodes)
    servers = [fakeredis.FakeServer() for _ in range(n)]
    # A generous round deadline: a new connection opens on a thread, late on a busy host.
    clients = [fakeredis.FakeRedis(server=s) for s in servers]
    return Redlock(clients, clock=clock, node_timeout=1.0), servers


def spy(monkeypatch, redlock: Redlock) -> list[list]:
    """Record every extend_many call on ``redlock`` (the leases it was given)."""
    calls: list[list] = []
    real = redlock.extend_many

    def extend_many(leases, ttl=None):
        calls.append(list(leases))
        return real(leases, ttl)

    monkeypatch.setattr(redlock, "extend_many", extend_many)
    return calls


def delete_on(servers, key: str) -> None:
    for server in servers:
        if isinstance(server, MemoryNode):
            server.client().delete(key)
        else:
            fakeredis.FakeRedis(server=server).delete(key)


def heartbeat_records(caplog, level: int) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "celery_redlock.heartbeat" and r.levelno == level
    ]


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def hb(clock):
    """A heartbeat driven by hand: no thread, the fake clock."""
    beat = Heartbeat(clock, autostart=False)
    yield beat
    beat.stop()


# -- rounds -------------------------------------------------------------------


def test_renew_once_renews_due_leases_and_not_others(hb, clock, monkeypatch):
    redlock, _ = cluster(clock)
    calls = spy(monkeypatch, redlock)
    a, b = redlock.acquire("a", ttl=TTL), redlock.acquire("b", ttl=TTL)
    hb.hold(a, 1.0)
    hb.hold(b, 3.0)

    hb.renew_once()  # nothing due yet
    assert calls == []

    clock.advance(1.0)
    hb.renew_once()
    assert calls == [[a]]
    assert a.remaining() == pytest.approx(VALID)
    assert b.remaining() == pytest.approx(VALID - 1.0)

    hb.renew_once()  # same instant: a is not due again
    assert calls == [[a]]

    clock.advance(1.0)  # the interval counts from a's last renewal
    hb.renew_once()
    assert calls == [[a], [a]]

    clock.advance(1.0)
    hb.renew_once()
    assert len(calls) == 3 and set(map(id, calls[2])) == {id(a), id(b)}
    assert b.remaining() == pytest.approx(VALID)
    assert not a.lost and not b.lost


def test_renew_once_takes_an_explicit_now(hb, clock, monkeypatch):
    redlock, _ = cluster(clock)
    calls = spy(monkeypatch, redlock)
    lease = redlock.acquire("job", ttl=TTL)
    hb.hold(lease, 2.0)
    hb.renew_once(now=clock() + 1.9)
    assert calls == []
    hb.renew_once(now=clock() + 2.0)
    assert calls == [[lease]]


def test_a_probe_runs_after_each_renewal_that_reached_a_quorum(hb, clock):
    """A lease held with a probe has it called after its renewals (not before one,
    not after a failed one); a probe that raises is logged, and the renewals go on."""
    redlock, servers = cluster(clock)
    lease = redlock.acquire("probed", ttl=TTL)
    seen: list[float] = []

    def probe(held):
        seen.append(held.remaining())
        if len(seen) == 2:
            raise RuntimeError("a probe that fails")

    hb.hold(lease, 1.0, probe=probe)
    hb.renew_once()
    assert seen == []  # not due yet
    clock.advance(1.0)
    hb.renew_once()
    clock.advance(1.0)
    hb.renew_once()  # raises in the probe: logged
    assert seen == [pytest.approx(VALID)] * 2 and not lease.lost
    delete_on(servers, lease.key)
    clock.advance(1.0)
    hb.renew_once()  # the renewal fails: the lease is lost, no probe
    assert len(seen) == 2 and lease.lost


def test_a_superseded_lease_raises_lock_superseded_and_stays_held(clock):
    """supersede() marks the lease once; check() then raises LockSuperseded (a
    LockLost) naming the successor, while the lease itself is not lost."""
    from celery_redlock.exceptions import LockSuperseded

    redlock, _ = cluster(clock)
    lease = redlock.acquire("superseded", ttl=TTL)
    lease.check()
    assert lease.supersede("newer") and not lease.supersede("newest")
    with pytest.raises(LockSuperseded) as info:
        lease.check()
    assert isinstance(info.value, LockLost) and info.value.successor == "newer"
    assert lease.superseded_by == "newer" and not lease.lost


def test_lease_deleted_on_a_majority_is_lost_and_reported_once(hb, clock, monkeypatch, caplog):
    redlock, servers = cluster(clock)
    calls = spy(monkeypatch, redlock)
    lease = redlock.acquire("job", ttl=TTL)
    seen = []
    hb.hold(lease, 1.0, on_lost=seen.append)
    delete_on(servers[:2], lease.key)

    with caplog.at_level(logging.WARNING, logger="celery_redlock.heartbeat"):
        for _ in range(3):
            clock.advance(1.0)
            hb.renew_once()

    assert seen == [lease]
    assert lease.lost and lease.remaining() > 0  # lost by quorum, not by time
    with pytest.raises(LockLost):
        lease.check()
    assert hb.held() == []
    assert calls == [[lease]]  # never renewed again
    (record,) = heartbeat_records(caplog, logging.WARNING)
    # the nodes answered that the key no longer holds its owner: no outage
    assert repr(lease.key) in record.getMessage() and FREED in record.getMessage()
    assert lease.lost_reason == FREED


def test_lease_deleted_on_a_minority_stays_held(hb, clock):
    redlock, servers = cluster(clock)
    lease = redlock.acquire("job", ttl=TTL)
    seen = []
    hb.hold(lease, 1.0, on_lost=seen.append)
    delete_on(servers[:1], lease.key)
    clock.advance(1.0)
    hb.renew_once()
    assert seen == [] and not lease.lost and hb.held() == [lease]
    assert lease.remaining() == pytest.approx(VALID)


def test_on_lost_that_raises_is_logged_and_the_next_round_runs(hb, clock, monkeypatch, caplog):
    redlock, servers = cluster(clock)
    calls = spy(monkeypatch, redlock)
    bad, good = redlock.acquire("bad", ttl=TTL), redlock.acquire("good", ttl=TTL)

    def explode(lease):
        raise RuntimeError("callback bug")

    hb.hold(bad, 1.0, on_lost=explode)
    hb.hold(good, 1.0)
    delete_on(servers, bad.key)

    clock.advance(1.0)
    hb.renew_once()  # does not raise
    (error,) = heartbeat_records(caplog, logging.ERROR)
    assert repr(bad.key) in error.getMessage()
    assert error.exc_info and error.exc_info[0] is RuntimeError

    clock.advance(1.0)
    hb.renew_once()
    assert calls[-1] == [good] and len(calls) == 2
    assert hb.held() == [good] and not good.lost


def test_drop_stops_renewal_and_is_idempotent(hb, clock, monkeypatch):
    redlock, _ = cluster(clock)
    calls = spy(monkeypatch, redlock)
    a, b, never = (redlock.acquire(n, ttl=TTL) for n in ("a", "b", "never"))
    hb.hold(a, 1.0)
    hb.hold(b, 1.0)
    hb.drop(a)
    hb.drop(a)
    hb.drop(never)
    assert hb.held() == [b]
    clock.advance(1.0)
    hb.renew_once()
    assert calls == [[b]]
    assert a.remaining() == pytest.approx(VALID - 1.0)


def test_many_leases_of_one_client_cost_one_call_per_round(hb, clock, monkeypatch):
    redlock, _ = cluster(clock)
    calls = spy(monkeypatch, redlock)
    leases = [redlock.acquire(f"job-{i}", ttl=TTL) for i in range(25)]
    for lease in leases:
        hb.hold(lease, 1.0)
    for round_ in range(1, 3):
        clock.advance(1.0)
        hb.renew_once()
        assert len(calls) == round_
        assert {id(lease) for lease in calls[-1]} == {id(lease) for lease in leases}
    assert all(lease.remaining() == pytest.approx(VALID) for lease in leases)


def test_a_client_that_raises_does_not_touch_the_others(hb, clock, monkeypatch, caplog):
    down, _ = cluster(clock)
    up, _ = cluster(clock)
    up_calls = spy(monkeypatch, up)

    def unavailable(leases, ttl=None):
        raise QuorumUnavailable({"redis://a": ConnectionError("refused")}, 2, 3)

    monkeypatch.setattr(down, "extend_many", unavailable)
    d1, d2 = down.acquire("d1", ttl=TTL), down.acquire("d2", ttl=TTL)
    u1, u2 = up.acquire("u1", ttl=TTL), up.acquire("u2", ttl=TTL)
    seen = []
    for lease in (d1, u1, d2, u2):
        hb.hold(lease, 1.0, on_lost=seen.append)

    clock.advance(1.0)
    hb.renew_once()

    assert seen == [d1, d2] and d1.lost and d2.lost
    assert hb.held() == [u1, u2]
    assert len(up_calls) == 1 and u1.remaining() == pytest.approx(VALID)
    messages = [r.getMessage() for r in heartbeat_records(caplog, logging.WARNING)]
    assert len(messages) == 2 and all("QuorumUnavailable" in m for m in messages)


def test_an_unreachable_client_does_not_touch_the_others(hb, clock):
    down, down_servers = cluster(clock)
    up, _ = cluster(clock)
    d, u = down.acquire("d", ttl=TTL), up.acquire("u", ttl=TTL)
    seen = []
    hb.hold(d, 1.0, on_lost=seen.append)
    hb.hold(u, 1.0, on_lost=seen.append)
    for server in down_servers:
        server.connected = False
    clock.advance(1.0)
    hb.renew_once()
    assert seen == [d] and d.lost
    assert hb.held() == [u] and u.remaining() == pytest.approx(VALID)


def test_a_lapsed_lease_is_marked_lost_not_renewed(hb, clock, monkeypatch, caplog):
    redlock, _ = cluster(clock)
    calls = spy(monkeypatch, redlock)
    lease = redlock.acquire("job", ttl=TTL)
    seen = []
    hb.hold(lease, 3.0, on_lost=seen.append)
    clock.advance(TTL)  # the process stalled past the validity
    hb.renew_once()
    assert calls == []  # renewing now might extend a lock someone else took meanwhile
    assert seen == [lease] and lease.lost and hb.held() == []
    (record,) = heartbeat_records(caplog, logging.WARNING)
    assert "validity" in record.getMessage()


def test_a_lease_marked_lost_elsewhere_is_reported_not_renewed(hb, clock, monkeypatch, caplog):
    redlock, _ = cluster(clock)
    calls = spy(monkeypatch, redlock)
    lease = redlock.acquire("job", ttl=TTL)
    seen = []
    hb.hold(lease, 1.0, on_lost=seen.append)
    lease.mark_lost()  # e.g. the task's own extend() fell short of a quorum
    clock.advance(1.0)
    hb.renew_once()
    assert calls == [] and seen == [lease] and hb.held() == []
    (record,) = heartbeat_records(caplog, logging.WARNING)
    assert "marked lost" in record.getMessage()


def test_a_lease_dropped_while_its_renewal_is_in_flight_is_not_reported(hb, clock, monkeypatch):
    redlock, servers = cluster(clock)
    lease = redlock.acquire("job", ttl=TTL)
    real = redlock.extend_many

    def extend_many_then_released(leases, ttl=None):
        hb.drop(lease)  # the task ended meanwhile, and released
        delete_on(servers, lease.key)
        return real(leases, ttl)

    monkeypatch.setattr(redlock, "extend_many", extend_many_then_released)
    seen = []
    hb.hold(lease, 1.0, on_lost=seen.append)
    clock.advance(1.0)
    hb.renew_once()
    assert seen == [] and hb.held() == []


def test_holding_again_updates_the_interval_from_the_last_renewal(hb, clock, monkeypatch):
    redlock, _ = cluster(clock)
    calls = spy(monkeypatch, redlock)
    lease = redlock.acquire("job", ttl=TTL)
    hb.hold(lease, 5.0)
    clock.advance(1.0)
    hb.hold(lease, 2.0)
    assert hb.held() == [lease]
    clock.advance(1.0)  # 2 s after the grant
    hb.renew_once()
    assert calls == [[lease]]


@pytest.mark.parametrize("interval", [0, -1, True, "1", float("nan"), TTL, TTL + 1])
def test_hold_rejects_a_bad_interval(hb, clock, interval):
    redlock, _ = cluster(clock)
    lease = redlock.acquire("job", ttl=TTL)
    with pytest.raises(ValueError, match="interval"):
        hb.hold(lease, interval)
    assert hb.held() == []


def test_hold_rejects_an_on_lost_that_is_not_callable(hb, clock):
    redlock, _ = cluster(clock)
    lease = redlock.acquire("job", ttl=TTL)
    with pytest.raises(TypeError, match="on_lost"):
        hb.hold(lease, 1.0, on_lost="log it")  # type: ignore[arg-type]


def test_no_strong_reference_keeps_a_lease_alive(clock):
    beat = Heartbeat(clock)  # with its thread
    try:
        redlock, _ = cluster(clock)
        dropped, forgotten = redlock.acquire("dropped", ttl=TTL), redlock.acquire("gone", ttl=TTL)
        beat.hold(dropped, 1.0)
        beat.hold(forgotten, 1.0)
        beat.drop(dropped)
        refs = weakref.ref(dropped), weakref.ref(forgotten)
        del dropped, forgotten
        gc.collect()
        assert [ref() for ref in refs] == [None, None]
        assert beat.held() == []
        clock.advance(1.0)
        beat.renew_once()  # a collected lease is simply forgotten
    finally:
        beat.stop(timeout=5)


# -- the thread ---------------------------------------------------------------


def test_the_thread_is_lazy_named_daemon_and_one_per_process(default_heartbeat):
    heartbeat.stop(timeout=5)
    assert threads_named(THREAD_NAME) == []
    redlock, _ = cluster()
    leases = [redlock.acquire(f"job-{i}", ttl=TTL) for i in range(3)]
    for lease in leases:
        heartbeat.hold(lease, 1.0)
    (thread,) = threads_named(THREAD_NAME)
    assert thread.daemon
    assert heartbeat.held() == leases

    heartbeat.stop(timeout=5)
    heartbeat.stop(timeout=5)
    assert not thread.is_alive()

    heartbeat.hold(leases[0], 1.0)  # a later hold starts a new thread
    (again,) = threads_named(THREAD_NAME)
    assert again is not thread


def test_the_thread_renews_and_wakes_for_a_shorter_interval(monkeypatch):
    beat = Heartbeat(name="test-heartbeat-wake")
    try:
        redlock, _ = cluster()
        calls = spy(monkeypatch, redlock)
        slow = redlock.acquire("slow", ttl=100.0)
        beat.hold(slow, 50.0)  # the thread now sleeps for 50 s...
        time.sleep(0.05)
        fast = redlock.acquire("fast", ttl=5.0)
        beat.hold(fast, 0.05)  # ...unless hold() wakes it
        deadline = time.monotonic() + 5
        while sum(1 for c in calls if c == [fast]) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum(1 for c in calls if c == [fast]) >= 3
        assert not fast.lost and not slow.lost
    finally:
        beat.stop(timeout=5)


def test_the_thread_survives_failures_and_keeps_renewing_the_rest(monkeypatch, caplog):
    beat = Heartbeat(name="test-heartbeat-survives")
    try:
        down, _ = cluster()
        up, _ = cluster()
        up_calls = spy(monkeypatch, up)
        monkeypatch.setattr(down, "extend_many", lambda leases, ttl=None: 1 / 0)
        fired = threading.Event()

        def on_lost(lease):
            fired.set()
            raise RuntimeError("callback bug")

        lost = down.acquire("down", ttl=1.0)
        kept = up.acquire("up", ttl=5.0)
        beat.hold(lost, 0.05, on_lost=on_lost)
        beat.hold(kept, 0.05)
        (thread,) = threads_named("test-heartbeat-survives")
        assert fired.wait(5)
        renewed = len(up_calls)
        deadline = time.monotonic() + 5
        while len(up_calls) < renewed + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(up_calls) >= renewed + 3  # still renewing after the failure
        assert lost.lost and not kept.lost and beat.held() == [kept] and thread.is_alive()
        assert "ZeroDivisionError" in heartbeat_records(caplog, logging.WARNING)[0].getMessage()
    finally:
        beat.stop(timeout=5)
    assert not thread.is_alive()


def test_on_lost_may_stop_the_heartbeat_from_its_own_thread():
    beat = Heartbeat(name="test-heartbeat-self-stop")
    redlock, servers = cluster()
    lease = redlock.acquire("job", ttl=1.0)
    stopped = threading.Event()

    def on_lost(lease):
        beat.stop()  # must not try to join its own thread
        stopped.set()

    beat.hold(lease, 0.05, on_lost=on_lost)
    (thread,) = threads_named("test-heartbeat-self-stop")
    delete_on(servers, lease.key)
    assert stopped.wait(5)
    thread.join(5)
    assert not thread.is_alive()


# -- fork and imports ---------------------------------------------------------


def _child_report(redlock: Redlock) -> dict:
    report = {
        "held": len(heartbeat.held()),
        "threads": [t.name for t in threading.enumerate()],
    }
    extended = []
    real = redlock.extend_many
    redlock.extend_many = lambda leases, ttl=None: extended.extend(leases) or real(leases, ttl)
    child_lease = redlock.acquire("child", ttl=TTL)
    heartbeat.hold(child_lease, 1.0)  # takes the lock that was held at fork time
    report["held_after_hold"] = [lease.name for lease in heartbeat.held()]
    report["threads_after_hold"] = [t.name for t in threading.enumerate()]
    heartbeat.renew_once(now=time.monotonic() + 2.0)
    report["extended"] = [lease.name for lease in extended]
    heartbeat.stop(timeout=5)
    report["threads_after_stop"] = [t.name for t in threading.enumerate()]
    return report


def test_a_forked_child_starts_empty_and_never_renews_the_parents_leases(default_heartbeat):
    redlock, _ = cluster()
    parent_lease = redlock.acquire("parent", ttl=TTL)
    heartbeat.hold(parent_lease, 5.0)
    (parent_thread,) = threads_named(THREAD_NAME)
    read_end, write_end = os.pipe()
    # Fork while the heartbeat's lock is held: the child must not deadlock on it.
    heartbeat.default._lock.acquire()
    try:
        with warnings.catch_warnings():  # Python 3.12+: "multi-threaded, use of fork()"
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                os.close(read_end)
                try:
                    data = json.dumps(_child_report(redlock))
                    code = 0
                except BaseException:
                    data = json.dumps({"error": traceback.format_exc()})
                os.write(write_end, data.encode())
            finally:
                os._exit(code)
    finally:
        heartbeat.default._lock.release()
    os.close(write_end)

    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung (a lock inherited from the parent?)")
        time.sleep(0.01)
    with os.fdopen(read_end, "rb") as pipe:
        report = json.loads(pipe.read() or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, report.get("error", report)

    assert report["held"] == 0
    assert THREAD_NAME not in report["threads"]
    assert report["held_after_hold"] == ["child"]
    assert report["threads_after_hold"].count(THREAD_NAME) == 1
    assert report["extended"] == ["child"]  # never the parent's lease
    assert THREAD_NAME not in report["threads_after_stop"]
    # The parent is untouched.
    assert heartbeat.held() == [parent_lease] and parent_thread.is_alive()


def test_the_module_works_without_celery():
    path = heartbeat.__file__
    code = (
        "import importlib.util, sys\n"
        "sys.modules['celery'] = sys.modules['kombu'] = None  # any import of them fails\n"
        f"spec = importlib.util.spec_from_file_location('standalone_heartbeat', {path!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "loaded = [m for m, v in sys.modules.items() if m.startswith(('celery', 'kombu')) and v]\n"
        "assert module.held() == [] and loaded == [], loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_hold_wakes_the_thread_only_for_a_lease_due_before_its_next_wake_up():
    redlock, _ = cluster()
    hb = Heartbeat(name="crl-test-wakes")
    wakes = []
    real_set = hb._wake.set
    hb._wake.set = lambda: (wakes.append(1), real_set())[1]  # count the wake-ups hold() asks for
    try:
        first = redlock.acquire("first", ttl=10)
        hb.hold(first, 1.0)  # nothing planned yet: wakes the new thread
        deadline = time.monotonic() + 5
        while hb._planned is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hb._planned is not None
        woken = len(wakes)
        later = redlock.acquire("later", ttl=10)
        hb.hold(later, 2.0)  # due after the planned wake-up: no wake
        assert len(wakes) == woken
        sooner = redlock.acquire("sooner", ttl=10)
        hb.hold(sooner, 0.2)  # due before it: wake
        assert len(wakes) == woken + 1
        for lease in (first, later, sooner):
            hb.drop(lease)
            redlock.release(lease)
    finally:
        hb.stop(timeout=5)


def test_the_heartbeats_reasons_read_as_the_leases():
    from celery_redlock.core import heartbeat, held

    assert (heartbeat._NO_QUORUM, heartbeat._LAPSED) == (held.NO_QUORUM, held.LAPSED)
