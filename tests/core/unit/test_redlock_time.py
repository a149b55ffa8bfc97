"""Redlock validity, drift, expiry and extension, on fakeredis nodes with a fake clock.

One ``fakeredis.FakeServer`` per node stands for one independent Redis master.
The client's clock is injected (``clock=`` / ``sleep=``) wherever only the
client's view of time matters; freezegun is used where the nodes' TTLs must
move too, since fakeredis expires keys by reading ``time.time()``.
"""

from __future__ import annotations

import random
import threading
import time

import fakeredis
import pytest
from freezegun import freeze_time

from celery_redlock.core import (
    DRIFT_FLOOR,
    Holder,
    Lease,
    Redlock,
    full_jitter,
    make_owner,
)
from celery_redlock.core.lease import SPLIT_RETRIES
from celery_redlock.core.nodes import redis as redis_kind
from celery_redlock.core.nodes import scripts
from celery_redlock.core.nodes.redis import first as redis_first
from celery_redlock.exceptions import LockLost, QuorumUnavailable

TTL = 10.0


class FakeClock:
    """A monotonic clock that moves only when told to (or when slept on)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def servers() -> list[fakeredis.FakeServer]:
    return [fakeredis.FakeServer() for _ in range(3)]


def clients(servers, **kwargs):
    return [fakeredis.FakeRedis(server=server, **kwargs) for server in servers]


def redlock(servers, **kwargs) -> Redlock:
    """A Redlock on the fake nodes. Their Lua runs on the client's threads, which a
    loaded host can stall past the 50 ms default: a round here must not lose a node to that."""
    return Redlock(clients(servers), **{"node_timeout": 2.0, **kwargs})


def peek(servers) -> list[fakeredis.FakeRedis]:
    """Decoded clients that look at the nodes behind the Redlock's back."""
    return clients(servers, decode_responses=True)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rl(servers, clock) -> Redlock:
    return redlock(servers, clock=clock, sleep=clock.sleep)


def test_fakeredis_clients_are_accepted_as_independent_nodes(servers, rl):
    assert len(rl.nodes) == 3 and rl.quorum == 2
    assert len({node.identity for node in rl.nodes}) == 3
    lease = rl.acquire("job", ttl=TTL)
    assert isinstance(lease, Lease)
    for client in peek(servers):
        assert client.get(lease.key) == lease.owner
        assert 0 < client.pttl(lease.key) <= TTL * 1000


def test_remaining_right_after_acquire_is_ttl_minus_drift(rl, clock):
    lease = rl.acquire("job", ttl=TTL)
    assert lease.remaining() == pytest.approx(TTL - TTL * 0.01 - DRIFT_FLOOR, abs=1e-9)
    assert lease.remaining() == pytest.approx(9.898, abs=1e-9)
    clock.advance(1.5)
    assert lease.remaining() == pytest.approx(9.898 - 1.5, abs=1e-9)
    assert not lease.lost


@pytest.mark.parametrize("drift_factor", [0.0, 0.1, 0.25])
def test_custom_drift_factor_changes_the_validity(servers, clock, drift_factor):
    rl = redlock(servers, clock=clock, drift_factor=drift_factor)
    lease = rl.acquire("job", ttl=TTL)
    assert lease.remaining() == pytest.approx(TTL - TTL * drift_factor - DRIFT_FLOOR, abs=1e-9)


def test_lease_past_its_validity_reports_lost(rl, clock):
    lease = rl.acquire("job", ttl=TTL)
    clock.advance(TTL - TTL * 0.01 - DRIFT_FLOOR - 0.001)
    assert lease.remaining() > 0 and not lease.lost
    lease.check()
    clock.advance(0.002)
    assert lease.remaining() <= 0
    assert lease.lost
    with pytest.raises(LockLost, match="job"):
        lease.check()
    # the drift margin: the nodes still hold the key, but the client no longer trusts it
    assert rl.holder("job").owner == lease.owner


def test_validity_uses_the_time_before_the_round_trip(servers, clock, monkeypatch):
    """Elapsed time during phase 1 is taken off the validity."""
    real = redis_kind.run

    def slow_nodes(call, *args, **kwargs):
        replies = real(call, *args, **kwargs)
        if call[0] is scripts.ACQUIRE:
            clock.advance(3.0)  # the acquire round took 3 s by the client's clock
        return replies

    monkeypatch.setattr(redis_kind.KIND, "run", slow_nodes)
    rl = redlock(servers, clock=clock)
    lease = rl.acquire("job", ttl=TTL)
    assert lease.remaining() == pytest.approx(TTL - 3.0 - TTL * 0.01 - DRIFT_FLOOR, abs=1e-9)


@pytest.mark.parametrize("slow_script", ["acquire", "fence"])
def test_validity_spent_during_acquire_means_no_lease_and_no_lock_key(
    servers, clock, monkeypatch, slow_script
):
    """A quorum granted, but the validity ran out (in phase 1, or in the fence
    phase): that grant is withdrawn, nobody holds the name, and the attempt is
    made again; every attempt too late is an outage, never a holder."""
    real = redis_kind.run
    scripts_run = []

    def slow_nodes(call, *args, **kwargs):
        replies = real(call, *args, **kwargs)
        scripts_run.append(call[0].name)
        if call[0].name == slow_script:
            clock.advance(TTL)
        return replies

    monkeypatch.setattr(redis_kind.KIND, "run", slow_nodes)
    rl = redlock(servers, clock=clock)
    lock_key, fence_key = rl.keys("job")
    # one node ahead of the others: the nodes disagree, so a fence phase is due
    peek(servers)[0].set(fence_key, "5000000000000000")
    if slow_script == "acquire":  # every attempt too late: not answering in time
        with pytest.raises(QuorumUnavailable, match="granted too late to stand"):
            rl.acquire("job", ttl=TTL)
        attempts = scripts_run.count("acquire")
        assert attempts == 1 + SPLIT_RETRIES and scripts_run[-1] == "release"
        for client in peek(servers):
            assert client.exists(lock_key) == 0  # withdrawn from every node
        # phase 1 moved the values on each time; nothing was written back
        fences = [client.get(fence_key) for client in peek(servers)]
        assert fences[0] == str(5000000000000000 + attempts) and fences[1] == fences[2]
    else:  # written back too late, but the nodes agree from then on: the next attempt stands
        assert scripts_run.count("fence") == 0
        lease = rl.acquire("job", ttl=TTL)
        assert scripts_run.count("fence") == 1 and "release" in scripts_run
        assert lease is not None and lease.fencing_token == 5000000000000002
        fences = [client.get(fence_key) for client in peek(servers)]
        assert fences == ["5000000000000002"] * 3


def test_one_round_when_the_nodes_agree_and_a_write_back_when_they_do_not(servers):
    scripts = []
    real = redis_kind.run

    def recording(call, *args, **kwargs):
        scripts.append(call[0].name)
        return real(call, *args, **kwargs)

    rl = redlock(servers)
    lock_key, fence_key = rl.keys("job")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(redis_kind.KIND, "run", recording)
        first = rl.acquire("job", ttl=TTL)  # the floor alike everywhere: the client's clock
        rl.release(first)
        second = rl.acquire("job", ttl=TTL)
        rl.release(second)
        assert scripts == ["acquire", "release", "acquire", "release"]
        assert second.fencing_token > first.fencing_token
        # a node whose value is behind (it missed grants, or was restored) takes the
        # floor as the others do: still one round
        peek(servers)[2].set(fence_key, "7")
        scripts.clear()
        third = rl.acquire("job", ttl=TTL)
        rl.release(third)
        assert scripts == ["acquire", "release"]
        assert third.fencing_token > second.fencing_token
        assert peek(servers)[2].get(fence_key) == str(third.fencing_token)
        # the largest value on one node only: phase 2 writes it on the others
        ahead = put_one_node_ahead(servers, fence_key, 0)
        scripts.clear()
        third = rl.acquire("job", ttl=TTL)
        assert scripts == ["acquire", "fence"]
    assert third.fencing_token == ahead + 1
    assert [c.get(fence_key) for c in peek(servers)] == [str(third.fencing_token)] * 3
    rl.release(third)


def put_one_node_ahead(servers, fence_key: str, index: int) -> int:
    """Give one node a fence value the others lack (it saw grants they missed); returns it.

    Raising one node's value never breaks monotonicity; it makes the next
    grant's nodes disagree, so that grant needs its phase 2.
    """
    clients_ = peek(servers)
    seed = time.time_ns() // 1000  # what a node without a value would start from
    ahead = max([seed] + [int(c.get(fence_key) or 0) for c in clients_]) + 10**9
    clients_[index].set(fence_key, str(ahead))
    return ahead


def test_fence_values_count_on_as_decimal_strings_past_two_to_the_53(servers):
    rl = redlock(servers)
    _, fence_key = rl.keys("job")
    for client in peek(servers):
        client.set(fence_key, "99999999999999999999")  # 10**20 - 1: no double holds it exactly
    lease = rl.acquire("job", ttl=TTL)
    assert lease.fencing_token == 10**20
    assert [c.get(fence_key) for c in peek(servers)] == ["100000000000000000000"] * 3


def test_expired_lease_frees_the_nodes_and_the_next_token_is_larger(servers):
    with freeze_time("2030-01-01 00:00:00") as frozen:
        rl = redlock(servers, clock=time.monotonic, sleep=frozen.tick)
        first = rl.acquire("job", ttl=5)
        other = redlock(servers, clock=time.monotonic)
        assert other.acquire("job", ttl=5) is None
        frozen.tick(4.9)
        assert not first.lost
        assert other.acquire("job", ttl=5) is None
        frozen.tick(0.2)  # past the TTL on the nodes, and past the validity
        assert first.lost and first.remaining() <= 0
        for client in peek(servers):
            assert client.get(first.key) is None
        second = other.acquire("job", ttl=5)
        assert second is not None
        assert second.fencing_token > first.fencing_token
        assert rl.extend(first) is False


def test_tokens_grow_under_a_frozen_node_clock(servers):
    """With TIME frozen, the fence value written back is what makes tokens grow."""
    with freeze_time("2030-01-01 00:00:00"):
        rl = redlock(servers, clock=time.monotonic)
        tokens = []
        for _ in range(5):
            lease = rl.acquire("job", ttl=TTL)
            tokens.append(lease.fencing_token)
            rl.release(lease)
    # 2030-01-01 in microseconds, the client's clock a second on: the time floor
    floor = 1_893_456_000 * 1_000_000 + 1_000_000
    assert tokens == [floor, floor + 1, floor + 2, floor + 3, floor + 4]


def test_a_grant_floors_its_value_at_the_node_clock_and_the_client_clock_a_second_on(servers):
    node = peek(servers)[0]

    def grant(name: str, client_us: str, stored: str | None = None) -> str:
        if stored is not None:
            node.set(f"f:{name}", stored)
        reply = node.eval(scripts.ACQUIRE.text, 2, f"k:{name}", f"f:{name}", "o", 5000, "60000",
                          client_us)  # fmt: skip
        return reply[1]

    with freeze_time("2030-01-01 00:00:00.000042"):  # the node's TIME: 42 microseconds in
        node_us = "1893456000000042"
        assert grant("a", "0") == node_us  # the microseconds padded to six digits
        assert grant("b", "0", stored="1893456000000041") == node_us
        assert grant("c", "0", stored=node_us) == "1893456000000043"  # moved on
        assert grant("d", "1893456999999999") == "1893457000999999"  # a second on, carried
        assert grant("e", "17", stored="5") == node_us
        assert grant("f", "17", stored="99999999999999999999") == "100000000000000000000"


def test_extend_sets_the_ttl_and_never_adds(servers):
    with freeze_time("2030-01-01 00:00:00") as frozen:
        rl = redlock(servers, clock=time.monotonic)
        lease = rl.acquire("job", ttl=TTL)
        frozen.tick(4)
        assert [c.pttl(lease.key) for c in peek(servers)] == [6000] * 3
        assert rl.extend(lease) is True
        assert [c.pttl(lease.key) for c in peek(servers)] == [10000] * 3  # not 16000
        assert lease.remaining() == pytest.approx(TTL - TTL * 0.01 - DRIFT_FLOOR, abs=1e-6)
        frozen.tick(4)
        assert rl.extend(lease, ttl=3) is True  # shorter than the 6 s left: set, not add
        assert [c.pttl(lease.key) for c in peek(servers)] == [3000] * 3
        # the validity the client trusts shrinks with the keys (it was 5.898 s)
        assert lease.remaining() == pytest.approx(3 - 0.03 - DRIFT_FLOOR, abs=1e-6)
        frozen.tick(3.01)
        assert lease.lost
        assert [c.get(lease.key) for c in peek(servers)] == [None] * 3


def test_extend_on_a_lapsed_lease_returns_false_and_marks_it_lost(rl, clock, servers):
    lease = rl.acquire("job", ttl=TTL)
    clock.advance(TTL)
    assert rl.extend(lease) is False
    assert lease.lost
    # a lapsed lease is not renewed on the nodes either
    assert [c.pttl(lease.key) for c in peek(servers)] == [pytest.approx(10000, abs=50)] * 3


def test_extend_after_the_key_was_lost_on_a_majority_marks_it_lost(rl, servers):
    lease = rl.acquire("job", ttl=TTL)
    for client in peek(servers)[:2]:
        client.set(lease.key, make_owner())  # taken over (e.g. expired and re-acquired)
    assert lease.remaining() > 0
    assert rl.extend(lease) is False
    assert lease.lost
    with pytest.raises(LockLost):
        lease.check()


def test_extend_with_a_minority_gone_keeps_the_lease(rl, servers):
    lease = rl.acquire("job", ttl=TTL)
    peek(servers)[0].delete(lease.key)
    assert rl.extend(lease) is True
    assert not lease.lost


def test_extend_many_renews_each_lease_on_its_own(rl, servers):
    a = rl.acquire("a", ttl=TTL)
    b = rl.acquire("b", ttl=TTL)
    for client in peek(servers)[:2]:
        client.delete(b.key)
    assert rl.extend_many([a, b]) == [True, False]
    assert not a.lost and b.lost


def test_disconnected_server_counts_as_an_error(rl, servers):
    servers[0].connected = False
    lease = rl.acquire("job", ttl=TTL)  # 2 of 3 is a quorum
    assert lease is not None
    report = rl.inspect("job")
    assert "error" in report[0] and report[0]["node"] == rl.nodes[0].name
    assert report[1]["holder"] == report[2]["holder"] == lease.owner
    assert rl.extend(lease) is True

    servers[1].connected = False
    assert rl.extend(lease) is False and lease.lost
    rl.release(lease)  # never raises
    with pytest.raises(QuorumUnavailable) as info:
        rl.acquire("other", ttl=TTL)
    assert set(info.value.errors) == {rl.nodes[0].name, rl.nodes[1].name}
    assert rl.nodes[0].name in str(info.value) and rl.nodes[1].name in str(info.value)
    assert rl.nodes[2].name not in str(info.value)
    # the one grant that happened (node 2) was withdrawn
    assert peek(servers)[2].exists(rl.keys("other")[0]) == 0
    with pytest.raises(QuorumUnavailable):
        rl.holder("job")
    with pytest.raises(QuorumUnavailable):
        rl.claim("slot", "v", ttl=TTL)


def test_disconnected_node_is_used_again_when_it_comes_back(rl, servers):
    servers[0].connected = False
    rl.release(rl.acquire("job", ttl=TTL))
    servers[0].connected = True
    lease = rl.acquire("job", ttl=TTL)
    assert peek(servers)[0].get(lease.key) == lease.owner


def test_blocking_acquire_gives_up_after_the_timeout(servers, clock):
    holder = redlock(servers, clock=clock)
    holder.acquire("job", ttl=60)
    waiter = redlock(servers, clock=clock, sleep=clock.sleep, rng=lambda: 1.0)
    assert waiter.acquire("job", ttl=TTL, blocking=True, timeout=1.0) is None
    # full jitter with rng=1: base * 2**n, cut to what is left of the timeout
    assert clock.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.25])
    assert sum(clock.sleeps) == pytest.approx(1.0)


def test_blocking_acquire_gets_the_lock_when_the_holder_expires(servers):
    with freeze_time("2030-01-01 00:00:00") as frozen:
        holder = redlock(servers, clock=time.monotonic)
        held = holder.acquire("job", ttl=2)
        start = time.monotonic()
        waiter = redlock(servers, clock=time.monotonic, sleep=frozen.tick)
        lease = waiter.acquire("job", ttl=TTL, blocking=True, timeout=30, retry_delay_max=0.5)
        waited = time.monotonic() - start
    assert lease is not None and lease.fencing_token > held.fencing_token
    assert 2.0 <= waited <= 2.6


def test_holder_reports_owner_and_remaining(rl, clock, servers):
    assert rl.holder("job") == Holder(None, None)
    owner = make_owner("task-42")
    lease = rl.acquire("job", ttl=TTL, owner=owner)
    found = rl.holder("job")
    assert found.owner == owner and found.task_id == "task-42"
    assert 9.9 <= found.remaining <= TTL
    # no majority agrees on one owner: nobody is reported
    a, b, c = peek(servers)
    b.set(lease.key, "other|h|1|x")
    c.delete(lease.key)
    assert rl.holder("job") == Holder(None, None)


def test_full_jitter_is_uniform_up_to_the_capped_exponential():
    assert full_jitter(0, 0.05, 1.0, rng=lambda: 1.0) == pytest.approx(0.05)
    assert full_jitter(3, 0.05, 1.0, rng=lambda: 1.0) == pytest.approx(0.4)
    assert full_jitter(10, 0.05, 1.0, rng=lambda: 1.0) == pytest.approx(1.0)
    assert full_jitter(10_000, 0.05, 1.0, rng=lambda: 0.5) == pytest.approx(0.5)
    assert full_jitter(5, 0.05, 1.0, rng=lambda: 0.0) == 0.0


# -- lazy fencing (fence=False): the token is issued on its first read ------------------


def count_scripts(monkeypatch, delay: float = 0.0) -> list[str]:
    """Record the name of every script the Redlock runs (optionally slowing ISSUE down):
    under the Redis kind's one-SET-NX fast path, which runs no script."""
    real = redis_first.run_script
    calls: list[str] = []

    def spy(call, *args, **kwargs):
        calls.append(call[0].name)
        if call[0] is scripts.ISSUE and delay:
            time.sleep(delay)
        return real(call, *args, **kwargs)

    monkeypatch.setattr(redis_first, "run_script", spy)
    return calls


def test_lazy_lease_moves_the_fence_only_when_the_token_is_read(rl, servers, monkeypatch):
    first = rl.acquire("job", ttl=TTL)
    rl.release(first)
    _, fence_key = rl.keys("job")
    ahead = put_one_node_ahead(servers, fence_key, 0)
    before = [c.get(fence_key) for c in peek(servers)]
    assert before == [str(ahead), str(first.fencing_token), str(first.fencing_token)]
    calls = count_scripts(monkeypatch)
    lease = rl.acquire("job", ttl=TTL, fence=False)
    assert calls == []  # the key only, by a bare SET NX: no script, no fence value moved
    assert [c.get(lease.key) for c in peek(servers)] == [lease.owner] * 3
    assert [c.get(fence_key) for c in peek(servers)] == before
    assert "unread" in repr(lease) and calls == []  # repr does no I/O

    token = lease.fencing_token
    assert calls == ["issue", "fence"]  # moved on everywhere, then written back
    assert token == ahead + 1
    assert [c.get(fence_key) for c in peek(servers)] == [str(token)] * 3
    assert lease.fencing_token == token and lease.fencing_token == token
    assert calls == ["issue", "fence"]  # later reads are cached: no I/O
    assert not lease.lost
    rl.release(lease)
    assert rl.acquire("job", ttl=TTL).fencing_token == token + 1


def test_lazy_lease_never_read_moves_no_fence_and_extends_and_releases(rl, servers, monkeypatch):
    _, fence_key = rl.keys("job")
    put_one_node_ahead(servers, fence_key, 0)
    before = [c.get(fence_key) for c in peek(servers)]
    lease = rl.acquire("job", ttl=TTL, fence=False)
    assert rl.extend(lease) is True
    rl.release(lease)
    assert [c.get(fence_key) for c in peek(servers)] == before
    assert [c.exists(lease.key) for c in peek(servers)] == [0] * 3
    calls = count_scripts(monkeypatch)
    with pytest.raises(LockLost):
        _ = lease.fencing_token  # released: nothing to issue the token for
    assert calls == []
    assert [c.get(fence_key) for c in peek(servers)] == before


def test_lazy_lease_whose_nodes_agree_has_its_token_in_one_round(rl, servers, monkeypatch):
    earlier = rl.acquire("job", ttl=TTL)
    rl.release(earlier)
    calls = count_scripts(monkeypatch)
    lease = rl.acquire("job", ttl=TTL, fence=False)
    assert "unread" in repr(lease) and calls == []  # a bare SET NX
    assert lease.fencing_token > earlier.fencing_token
    assert calls == ["issue"]
    _, fence_key = rl.keys("job")
    assert [c.get(fence_key) for c in peek(servers)] == [str(lease.fencing_token)] * 3


def test_lazy_first_token_of_a_new_name_is_seeded_from_the_clock(rl, servers):
    before = time.time_ns() // 1000 + 1_000_000  # the client's clock a second on
    lease = rl.acquire("fresh", ttl=TTL, fence=False)
    assert before <= lease.fencing_token <= time.time_ns() // 1000 + 1_000_000
    assert rl.acquire("fresh", ttl=TTL) is None  # still held
    rl.release(lease)
    assert rl.acquire("fresh", ttl=TTL).fencing_token > lease.fencing_token


def test_lazy_read_after_the_key_is_gone_on_a_majority_raises_and_marks_lost(rl, servers):
    _, fence_key = rl.keys("job")
    ahead = put_one_node_ahead(servers, fence_key, 2)
    before = [c.get(fence_key) for c in peek(servers)]
    lease = rl.try_acquire("job", ttl=TTL, fence=False)
    assert isinstance(lease, Lease)
    for client in peek(servers)[:2]:
        client.set(lease.key, make_owner())  # expired and taken by someone else
    with pytest.raises(LockLost, match="job"):
        _ = lease.fencing_token
    assert lease.lost
    with pytest.raises(LockLost):
        _ = lease.fencing_token  # and it stays so
    # only the one node that still holds the key moved its value on; no quorum did
    after = [c.get(fence_key) for c in peek(servers)]
    assert after == [*before[:2], str(ahead + 1)]


def test_lazy_read_after_validity_ran_out_raises_without_io(rl, servers, clock, monkeypatch):
    put_one_node_ahead(servers, rl.keys("job")[1], 0)
    lease = rl.acquire("job", ttl=TTL, fence=False)
    clock.advance(TTL)
    calls = count_scripts(monkeypatch)
    with pytest.raises(LockLost):
        _ = lease.fencing_token
    assert calls == [] and lease.lost


def test_lazy_token_cannot_be_issued_after_a_later_eager_grant(servers, clock):
    """A later grant needs the lazy lease's key gone on a majority: the lazy read then fails."""
    a = redlock(servers, clock=clock)
    b = redlock(servers, clock=clock)
    _, fence_key = a.keys("job")
    put_one_node_ahead(servers, fence_key, 0)
    lazy = a.acquire("job", ttl=TTL, fence=False)
    for client in peek(servers):  # the keys expire behind the client's back (a long pause)
        client.delete(lazy.key)
    eager = b.acquire("job", ttl=TTL)
    assert eager is not None and not lazy.lost  # the lazy client does not know yet
    with pytest.raises(LockLost):
        _ = lazy.fencing_token
    assert lazy.lost
    assert [c.get(fence_key) for c in peek(servers)] == [str(eager.fencing_token)] * 3
    # and only on 1 of 3 nodes: a lazy lease whose key survives on a minority still fails,
    # even with a candidate above the later grant's token
    b.release(eager)
    put_one_node_ahead(servers, fence_key, 2)
    lazy = a.acquire("job", ttl=TTL, fence=False)
    for client in peek(servers)[:2]:
        client.delete(lazy.key)
    later = b.acquire("job", ttl=TTL)
    assert later is not None and later.fencing_token > eager.fencing_token
    with pytest.raises(LockLost):
        _ = lazy.fencing_token
    assert [c.get(fence_key) for c in peek(servers)][:2] == [str(later.fencing_token)] * 2


def test_concurrent_first_reads_issue_the_token_once(rl, servers, monkeypatch):
    put_one_node_ahead(servers, rl.keys("job")[1], 1)
    lease = rl.acquire("job", ttl=TTL, fence=False)
    calls = count_scripts(monkeypatch, delay=0.05)
    start = threading.Barrier(4)
    seen: list[int] = []

    def read():
        start.wait(5)
        seen.append(lease.fencing_token)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(seen) == 4 and len(set(seen)) == 1
    assert calls == ["issue", "fence"]


def test_lazy_with_fencing_off_has_no_token_and_no_io(servers, clock, monkeypatch):
    rl = redlock(servers, clock=clock, fencing=False)
    lease = rl.acquire("job", ttl=TTL, fence=False)
    calls = count_scripts(monkeypatch)
    assert lease.fencing_token is None and calls == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_interleaved_eager_and_lazy_grants_issue_increasing_tokens(servers, seed):
    """Clocks frozen, so only the fence values make tokens grow; some lazy tokens are never
    read, some are read late (after an extension), some leases lapse and are taken over,
    and now and then one node gets ahead of the others (it saw grants they missed)."""
    rng = random.Random(seed)
    issued: list[int] = []
    with freeze_time("2030-01-01 00:00:00") as frozen:
        rls = [redlock(servers, clock=time.monotonic) for _ in range(2)]
        fence_key = rls[0].keys("job")[1]
        for _ in range(60):
            if rng.random() < 0.3:
                put_one_node_ahead(servers, fence_key, rng.randrange(3))
            rl = rng.choice(rls)
            eager = rng.random() < 0.5
            lease = rl.acquire("job", ttl=2, fence=eager)
            assert lease is not None
            mode = rng.choice(["read", "read-late", "unread", "lapse"])
            if mode == "read-late":
                frozen.tick(1)
                assert rl.extend(lease) is True
            if mode != "unread" and mode != "lapse":
                issued.append(lease.fencing_token)
            if mode == "lapse":
                frozen.tick(2.1)  # the keys expire on the nodes; the next grant takes over
                if eager or "unread" not in repr(lease):  # issued at the grant
                    issued.append(lease.fencing_token)
                else:
                    with pytest.raises(LockLost):
                        _ = lease.fencing_token
                continue
            rl.release(lease)
    assert issued and all(y > x for x, y in zip(issued, issued[1:])), issued
