"""Rate reservations (``Redlock.rate``, :mod:`celery_redlock.core.rates`) on real nodes.

The instants a reservation returns are the schedule: the tests count them per
window, the way the README states the guarantee (at most N booked starts in any
half-open window of the period with burst 1; each window of several).
"""

from __future__ import annotations

import threading
import time

import pytest

from celery_redlock.core import (
    ConfigurationError,
    Holder,
    Lease,
    QuorumUnavailable,
    RateKey,
    RateSlot,
    Redlock,
    parse_rate,
    peek_rate,
    reserve_place,
    reserve_rates,
)
from tests.support.healthy import healthy
from tests.support.ttl import left_at_least
from tests.support.windows import most_in_window

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: The node timeout of the tests on every kind of node: none of them is about the
#: timeout, and a loaded host's healthy etcd or PostgreSQL node outlasted 0.5 s
#: (an etcd call is a raft commit, a PostgreSQL call a commit; 3x what their pages advise).
NODE_TIMEOUT = 1.5


#: Reservations a caller makes of one start before the test calls the splits a fault.
SPLIT_TRIES = 5


def book(rl: Redlock, name: str, rate, n: int, threads: int = 4, **kw) -> list[float]:
    """``n`` reservations from ``threads`` threads at once: their instants."""
    out: list[float] = []
    lock = threading.Lock()

    def worker(count: int) -> None:
        for _ in range(count):
            # A reservation whose every round split the nodes is booked again, as
            # the task layer does (busy threads on a loaded host can split all five).
            for _ in range(SPLIT_TRIES):
                slot = rl.rate(name, rate, **kw)
                if slot.reserved:
                    break
            assert slot.reserved, f"{SPLIT_TRIES} reservations in a row split the nodes"
            with lock:
                out.append(slot.start_at)

    pool = [threading.Thread(target=worker, args=(n // threads,)) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return out


def test_concurrent_reservations_get_distinct_instants_spaced_by_the_rate(nodes3):
    rl = Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT)
    instants = book(rl, "api", "10/s", 80)
    assert len(instants) == 80
    ordered = sorted(instants)
    # distinct, and no two closer than T = 100 ms (1 ms of rounding to whole ms)
    gaps = [b - a for a, b in zip(ordered, ordered[1:])]
    assert min(gaps) >= 0.099, min(gaps)
    assert most_in_window(instants, 1.0) <= 10
    # the limit is used, not wasted: 80 starts within ~8 s (splits waste a few slots,
    # more of them when both cores are busy and the nodes are three clusters)
    assert ordered[-1] - ordered[0] < 8.0 + 3.0, ordered[-1] - ordered[0]


def test_two_windows_both_hold(nodes3):
    """5/s paces, 20/10s counts: 20 starts go at 5/s, the next wait for the first's
    10 s to pass. A counted window holds N on each node; reservations that split
    the nodes can be counted on different ones (at most n / q * N, the rates page)."""
    rl = Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT)
    instants = sorted(book(rl, "two", ("5/s", "20/10s"), 40))
    assert most_in_window(instants, 1.0) <= 5
    n = len(nodes3.urls)
    assert most_in_window(instants, 10.0) <= 20 * n // (n // 2 + 1)
    # the limit is used: the first 20 at 5/s (3.8 s; splits waste a few slots, more
    # on a loaded host), not spread over the 10 s window (14 in 7 s at 20/10s)
    assert most_in_window(instants, 7.0) >= 16, instants
    # the 10 s window is what holds the rest back: 40 starts need more than 10 s
    assert instants[-1] - instants[0] >= 10.0


def test_burst_then_spacing(nodes3):
    # One start a second: the bookings below are all made long before the 4th start
    # is due, even on a loaded host, so its schedule is pure arithmetic.
    rl = Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT)
    slots = [rl.rate("bursty", "1/s", burst=3) for _ in range(6)]
    assert [s.now for s in slots[:3]] == [True, True, True]
    assert not slots[3].now
    starts = [s.start_at for s in slots]
    assert most_in_window(starts, 1.0) <= 1 + 3 - 1
    assert starts[4] - starts[3] == pytest.approx(1.0, abs=0.002)


def test_shared_name_with_also(quick3):
    """A name's rate booked with ``also`` and on its own is one schedule."""
    rl = Redlock(quick3.urls, node_timeout=0.5)
    a = [rl.rate(f"account-{i}", "100/s", also={"payment-api": "10/s"}).start_at for i in range(5)]
    b = [rl.rate("payment-api", "10/s").start_at for _ in range(5)]
    assert most_in_window(a + b, 1.0) <= 10
    assert len(set(a + b)) == 10


def test_a_place_is_booked_only_in_a_full_schedule(quick3):
    """``reserve_place``: a start held back by something else (a key held) books a
    place only when the schedule's first free instant is further off than asked;
    else it books nothing, on no node."""
    rl = Redlock(quick3.urls, node_timeout=0.5)
    keys = [RateKey(rl.coalesce_key("place", "rate"), parse_rate("10/s"))]
    assert reserve_place(rl, keys, 0.005) is None  # an empty schedule admits one now
    first = rl.rate("place", "10/s")
    assert first.now  # so nothing was booked by the place asked for
    place = reserve_place(rl, keys, 0.005)
    assert place is not None and place.reserved
    assert place.start_at == pytest.approx(first.start_at + 0.1, abs=0.002)
    assert reserve_place(rl, keys, 0.5) is None  # the next instant is 0.2 s off
    after = rl.rate("place", "10/s")
    assert after.start_at == pytest.approx(place.start_at + 0.1, abs=0.002)


def test_a_minority_down_changes_nothing(quick3):
    rl = Redlock(quick3.urls, node_timeout=0.2)
    before = book(rl, "minority", "20/s", 20, threads=2)
    quick3.kill(2)
    after = book(rl, "minority", "20/s", 20, threads=2)
    instants = before + after
    assert most_in_window(instants, 1.0) <= 20
    assert min(b - a for a, b in zip(sorted(instants), sorted(instants)[1:])) >= 0.049


def test_a_majority_down_raises(quick3):
    rl = Redlock(quick3.urls, node_timeout=0.2)
    rl.rate("majority", "10/s")
    quick3.kill(1)
    quick3.kill(2)
    with pytest.raises(QuorumUnavailable):
        rl.rate("majority", "10/s")


def test_attempts_during_an_outage_leave_no_booking_behind(quick3):
    """Phase 1 books on the minority that answers; a round short of a quorum takes those
    bookings back, so the schedule after the outage is the one before it."""
    rl = Redlock(quick3.urls, node_timeout=0.2)
    quick3.kill(0)
    quick3.kill(1)
    for _ in range(50):  # 5 s of schedule at 10/s, were they kept
        with pytest.raises(QuorumUnavailable):
            rl.rate("outage", "10/s")
    quick3.heal()
    assert rl.rate("outage", "10/s").now
    gaps = [rl.rate("outage", "10/s").wait for _ in range(3)]
    assert max(gaps) <= 0.3 + 0.05, gaps


def test_a_node_restarted_empty_alone_changes_nothing(quick3):
    """With the other nodes answering, the largest answer wins: no over-admission."""
    rl = Redlock(quick3.urls, node_timeout=0.5)
    first = [rl.rate("restart", "10/s").start_at for _ in range(15)]
    quick3.restart(0)  # no persistence: back empty
    second = [rl.rate("restart", "10/s").start_at for _ in range(15)]
    assert most_in_window(first + second, 1.0) <= 10
    assert min(second) > max(first)


def test_a_node_restarted_empty_over_admits_at_most_the_documented_bound(quick3):
    """The worst case the README states: the bookings one node alone held for the
    quorum are forgotten, so a second schedule starts beside the first: at most
    2 * (N + B - 1) booked starts in any window, never more."""
    rl = Redlock(quick3.urls, node_timeout=0.2)
    quick3.kill(2)  # bookings land on nodes 0 and 1 only
    first = [rl.rate("worst", "10/s").start_at for _ in range(20)]  # 2 s of schedule
    quick3.restart(2)  # back, empty: it never saw them
    quick3.restart(0)  # node 0 loses them too; node 1 (the only one left) goes away
    quick3.kill(1)
    second = [rl.rate("worst", "10/s").start_at for _ in range(20)]
    both = first + second
    assert most_in_window(second, 1.0) <= 10  # each schedule holds on its own
    assert most_in_window(both, 1.0) <= 2 * 10
    assert most_in_window(both, 1.0) > 10  # the forgotten schedule was over-admitted


def test_a_client_clock_behind_is_bounded(quick3):
    """A caller whose clock is d behind books instants d late in true time: a window
    of true time holds at most N + ceil(d / T)."""
    rl = Redlock(quick3.urls, node_timeout=0.5)
    keys = [RateKey(rl.coalesce_key("skew", "rate"), parse_rate("10/s"))]
    now = time.time()
    d = 0.35
    right = [reserve_rates(rl, keys, now_ms=int(now * 1000)).start_at for _ in range(10)]
    # the slow clock's bookings, as true time (its instants + d)
    behind = [reserve_rates(rl, keys, now_ms=int((now - d) * 1000)).start_at + d for _ in range(10)]
    assert most_in_window(right + behind, 1.0) <= 10 + 4  # ceil(0.35 / 0.1) = 4


def test_peek_shows_the_schedule(quick3):
    rl = Redlock(quick3.urls, node_timeout=0.5)
    began = time.monotonic()
    first = [rl.rate("peeked", ("10/s", "20/m")) for _ in range(20)][0]
    view = peek_rate(rl, "peeked", ("10/s", "20/m"))
    assert view.answered == 3
    (second, at_s), (minute, at_m) = view.windows
    assert str(second) == "10/s" and str(minute) == "20/m"
    # 10/s paces: 20 starts booked 0.1 s apart (all within the first 2 s, even on a
    # loaded host); 20/m counts: its 20 are booked, so the next comes a minute
    # after the first
    assert at_s - first.start_at == pytest.approx(2.0, abs=0.002)
    assert at_m - first.start_at == pytest.approx(60.0, abs=0.002)
    assert view.next_start == pytest.approx(at_m)
    for node in quick3:
        with node.client() as client:
            # the schedule (2 s ahead of the first) plus the longest period: nothing
            # outlives its use
            left = client.pttl(rl.coalesce_key("peeked", "rate"))
            assert left_at_least(began, 62_000) <= left <= 62_000


def test_a_booking_is_one_round(redis_nodes3, monkeypatch):
    """Uncontended, a reservation is one script call per node, sent at once: what a rated
    start adds to its run lock is one lock round."""
    from celery_redlock.core.nodes.redis import rounds as _nodes

    rl = healthy(redis_nodes3.urls)
    rl.rate("rounds", "100/s")  # the script is loaded: each round below is one EVALSHA
    rounds = []
    real = _nodes.gather_each  # every masters' round goes through it

    def spy(nodes, commands, *rest, **options):
        rounds.append((commands[0].parts[0][0], len(nodes)))
        return real(nodes, commands, *rest, **options)

    monkeypatch.setattr(_nodes, "gather_each", spy)
    for _ in range(5):
        rl.rate("rounds", "100/s")
        rl.rate("rounds-and-api", "100/s", also={"api": ("10/s", "500/h")})
    assert rounds == [("EVALSHA", 3)] * 10


def rated_key(rl: Redlock, name: str, rate, burst: int = 1) -> RateKey:
    return RateKey(
        rl.coalesce_key(name, "rate"), parse_rate(rate), burst, rl.coalesce_key(name, "starts")
    )


def test_a_rated_start_due_now_is_one_acquire_round(redis_nodes3, monkeypatch):
    """The lock and the booking go in one call per node: a rated start that is due
    costs the run lock's round and nothing more (the release aside)."""
    from celery_redlock.core.nodes.redis import rounds as _nodes

    rl = healthy(redis_nodes3.urls)
    api = rated_key(rl, "api-1r", "1000/s")
    rl.release(rl.try_acquire("warm", ttl=5, rates=[api]))  # scripts loaded
    sent = []
    real = _nodes.gather_each  # every masters' round goes through it

    def spy(nodes, commands, *rest, **options):
        sent.append((commands[0].parts[0][0], len(nodes)))
        return real(nodes, commands, *rest, **options)

    monkeypatch.setattr(_nodes, "gather_each", spy)
    for i in range(5):
        lease = rl.try_acquire(f"job-{i}", ttl=5, rates=[api])
        assert isinstance(lease, Lease)
        assert sent == [("EVALSHA", 3)]
        monkeypatch.setattr(_nodes, "gather_each", real)
        rl.release(lease)
        monkeypatch.setattr(_nodes, "gather_each", spy)
        sent.clear()


def test_rated_starts_are_spaced_and_recorded(nodes3):
    """Starts booked for later hold nothing and record nothing; the ones that run are
    recorded once each, on every node that granted them. (A rate on a Redis Cluster
    node shares the locks' hash tag: one call takes keys of one slot.) One start in
    3 s: the second call comes long before its instant, and a start's record (kept a
    period) is read back before it ages out, even on a loaded host, whose rounds on
    one PostgreSQL node took past 0.2 s and whose read after a grant past 1 s."""
    rl = healthy(nodes3.urls)
    api = rated_key(rl, "{rec}:api", "1/3s")
    results = [rl.try_acquire(f"{{rec}}:{i}", ttl=5, rates=[api]) for i in range(4)]
    assert isinstance(results[0], Lease)
    later = results[1:]
    assert all(isinstance(r, RateSlot) and r.reserved for r in later)
    # booked 3 s apart (what a client sees of it depends on how long its rounds took)
    instants = [r.start_at for r in later]
    assert [b - a for a, b in zip(instants, instants[1:])] == pytest.approx([3.0, 3.0], abs=0.002)
    assert 0 < later[0].wait <= 3.0
    for node in nodes3:
        c = node.client()
        assert c.zrange(api.starts, 0, -1) == [results[0].owner]
        assert not [k for k in c.keys("*lock:{rec}:*") if k != results[0].key]
    # the first later start comes back at its instant: the round only records it
    time.sleep(max(0.0, later[0].start_at - time.time()))
    lease = rl.try_acquire("{rec}:1", ttl=5, rates=[api], booked=True)
    assert isinstance(lease, Lease)
    # recorded once; the first start's record may have aged out (a period old)
    recorded = nodes3[0].client().zrange(api.starts, 0, -1)
    assert recorded.count(lease.owner) == 1 and set(recorded) <= {results[0].owner, lease.owner}
    rl.release(lease)
    rl.release(results[0])


def test_a_contended_start_books_nothing(nodes3):
    rl = healthy(nodes3.urls)
    api = rated_key(rl, "{busy}:api", "1/s")
    held = rl.try_acquire("busy", ttl=5)
    assert isinstance(held, Lease)
    for _ in range(3):
        assert isinstance(rl.try_acquire("busy", ttl=5, rates=[api]), Holder)
    for node in nodes3:
        assert node.client().exists(api.key, api.starts) == 0
    rl.release(held)
    lease = rl.try_acquire("busy", ttl=5, rates=[api])
    assert isinstance(lease, Lease)  # the rate's capacity is whole: due at once
    rl.release(lease)


def test_a_rated_permit_books_in_its_round(nodes3):
    rl = healthy(nodes3.urls)
    api = rated_key(rl, "{pool}:api", "1/3s")  # the second round comes before its instant
    began = time.time()
    first = rl.try_acquire("pool", ttl=5, limit=3, rates=[api])
    second = rl.try_acquire("pool", ttl=5, limit=3, rates=[api])
    assert isinstance(first, Lease) and isinstance(second, RateSlot)
    # 3 s after the first start, which came within the rounds since ``began``
    assert began + 3.0 <= second.start_at + 0.002 <= time.time() + 3.002
    for node in nodes3:  # the later start holds no permit
        assert node.client().keys("*permit:{pool}*") == []
    rl.release(first)


def test_a_rated_round_short_of_a_quorum_books_nothing(redis_nodes3):
    rl = Redlock(redis_nodes3.urls, node_timeout=0.2)
    api = rated_key(rl, "api-out", "1/s")
    redis_nodes3.kill(1)
    redis_nodes3.kill(2)
    try:
        for _ in range(3):
            with pytest.raises(QuorumUnavailable):
                rl.try_acquire("out", ttl=5, rates=[api])
        c = redis_nodes3[0].client()  # the minority's bookings and starts taken back
        assert c.hkeys(api.key) == ["v"] and c.exists(api.starts, "redlock:lock:{out}") == 0
    finally:
        redis_nodes3.restart(1)
        redis_nodes3.restart(2)
    lease = rl.try_acquire("out", ttl=5, rates=[api])  # a read of the nodes, then booked
    assert isinstance(lease, Lease)  # at once: the attempts in the outage booked nothing
    rl.release(lease)


def test_a_rate_on_another_slot_is_refused_on_a_cluster(redis_clusters3):
    rl = Redlock(redis_clusters3.urls)
    with pytest.raises(ConfigurationError, match="rates: .*different hash slots"):
        rl.try_acquire("order-7", ttl=5, rates=[rated_key(rl, "payment-api", "10/s")])
