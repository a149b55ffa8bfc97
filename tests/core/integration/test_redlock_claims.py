"""Claims and receipts in the Redlock core, on real redis-server nodes.

A claim names the id meant to take a name next; a receipt records that an id
finished. Both ride in the acquire and release rounds (see ``celery_redlock.core.nodes.scripts``).
"""

from __future__ import annotations

import random
import threading
import time
from unittest.mock import ANY

import pytest

from celery_redlock.exceptions import QuorumUnavailable
from celery_redlock.redlock import (
    Claim,
    Finished,
    Holder,
    Lease,
    Redlock,
    TooEarly,
    full_jitter,
    make_owner,
)
from tests.support.healthy import healthy, healthy_under
from tests.support.kinds import needs_three

pytestmark = pytest.mark.integration

NAME = "report:{abc}"
#: The throttle tests' period: their calls before a due time take well under it.
PERIOD = 3.0


@pytest.fixture
def rl(nodes3):
    yield from healthy_under(nodes3, "crl-claims")


def values(nodes, key):
    out = []
    for node in nodes:
        with node.client() as c:
            out.append(c.get(key))
    return out


def test_keys_share_the_lock_keys_hash_slot(rl):
    lock, fence = rl.keys(NAME)
    assert rl.claim_key(NAME) == "crl-claims:claim:report:{abc}"
    assert rl.receipt_key(NAME, "t1") == "crl-claims:receipt:report:{abc}:t1"
    assert lock.endswith("{abc}") and fence.endswith("{abc}")
    assert rl.claim_key("plain") == "crl-claims:claim:{plain}"


def test_claim_is_taken_kept_and_renewed(rl, nodes3):
    first = rl.claim_next(NAME, "t1", ttl=30)
    assert first == Claim("t1", 30, None, False)
    assert values(nodes3, rl.claim_key(NAME)) == ["t1"] * len(nodes3)

    other = rl.claim_next(NAME, "t2", ttl=30)
    assert other.claimant == "t1" and 25 < other.remaining <= 30

    again = rl.claim_next(NAME, "t1", ttl=60)
    assert again.claimant == "t1" and again.renewed
    with nodes3[0].client() as c:
        assert c.pttl(rl.claim_key(NAME)) > 55_000  # raised to the longer TTL
    rl.claim_next(NAME, "t1", ttl=5)
    with nodes3[0].client() as c:
        assert c.pttl(rl.claim_key(NAME)) > 55_000  # never lowered
    assert rl.claimant(NAME).claimant == "t1"


def test_a_free_names_claim_is_a_bare_set_nx(redis_nodes3):
    rl = healthy(redis_nodes3.urls, key_prefix="crl-bare")

    def scripts_run() -> list[int]:
        out = []
        for node in redis_nodes3:
            with node.client() as c:
                out.append(c.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        return out

    before = scripts_run()
    assert rl.claim_next(NAME, "t1", ttl=30) == Claim("t1", 30, None, False)
    assert scripts_run() == before  # no script on any node
    assert rl.claim_next(NAME, "t1", ttl=30).renewed  # refused: the script renews it
    assert scripts_run() == [n + 1 for n in before]


def test_replace_takes_the_claim_over_and_names_the_previous(rl, nodes3):
    rl.claim_next(NAME, "t1", ttl=30)
    taken = rl.claim_next(NAME, "t2", ttl=30, replace=True)
    assert taken.claimant == "t2" and taken.previous == "t1"
    assert values(nodes3, rl.claim_key(NAME)) == ["t2"] * len(nodes3)


def test_withdraw_is_owner_checked(rl, nodes3):
    rl.claim_next(NAME, "t1", ttl=30)
    assert rl.withdraw_claim(NAME, "t2") == 0
    assert rl.claimant(NAME).claimant == "t1"
    assert rl.withdraw_claim(NAME, "t1") == len(nodes3)
    assert rl.claimant(NAME) == Claim(None, None)


def test_a_claim_short_of_a_quorum_is_withdrawn(rl, nodes3):
    needs_three(nodes3)
    # Two other claimants already hold one node each: t3 wins only one node.
    with nodes3[0].client() as c:
        c.set(rl.claim_key(NAME), "t1", px=30_000)
    with nodes3[1].client() as c:
        c.set(rl.claim_key(NAME), "t2", px=30_000)
    split = rl.claim_next(NAME, "t3", ttl=30)
    assert split == Claim(None, None)  # no quorum agrees: the caller tries again
    assert values(nodes3, rl.claim_key(NAME)) == ["t1", "t2", None]


def test_concurrent_claims_elect_one_claimant(rl, nodes3):
    # Eight threads of one process take turns on the GIL: a thread starved
    # past its node timeout misses the reply to its own claim, withdraws it
    # where it saw it, and may still have been named by a thread that read it
    # on a majority a moment before (seen beside busy loops with 2 s). What
    # is tested here is the election, not that timeout: none is reached.
    # A split withdraws every claim of it; callers try again after a jittered
    # pause, as the enqueue path does, or eight threads can keep splitting.
    rl = healthy(nodes3.urls, key_prefix="crl-claims", node_timeout=30)  # the fixture cleans up
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def claim(i: int) -> None:
        barrier.wait()
        rng = random.Random(i).random
        for attempt in range(200):
            result = rl.claim_next(NAME, f"t{i}", ttl=30)
            if result.claimant is not None:
                winners.append(result.claimant)
                return
            time.sleep(full_jitter(attempt, 0.002, 0.05, rng))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 8 and len(set(winners)) == 1


def test_acquire_honours_the_claim(rl, nodes3):
    rl.claim_next(NAME, "t1", ttl=30)
    other = rl.try_acquire(NAME, ttl=10, owner=make_owner("t2"), task_id="t2", claim="check")
    assert isinstance(other, Claim) and other.claimant == "t1"
    assert values(nodes3, rl.keys(NAME)[0]) == [None] * len(nodes3)  # nothing left held

    # Without claim=, the claim is not looked at (a plain lock).
    plain = rl.try_acquire(NAME, ttl=10, owner=make_owner("t2"))
    assert isinstance(plain, Lease)
    rl.release(plain)

    kept = rl.try_acquire(NAME, ttl=10, owner=make_owner("t1"), task_id="t1", claim="check")
    assert isinstance(kept, Lease)
    assert rl.claimant(NAME).claimant == "t1"  # "check" keeps it
    rl.release(kept, withdraw_claim=True)
    # withdrawn at the end, leaving the mark of a run that started, as "take" does
    assert values(nodes3, rl.claim_key(NAME)) == ["~t1"] * len(nodes3)
    assert rl.claimant(NAME) == Claim(None, None)

    rl.claim_next(NAME, "t1", ttl=30)
    taken = rl.try_acquire(NAME, ttl=10, owner=make_owner("t1"), task_id="t1", claim="take")
    assert isinstance(taken, Lease)
    # "take" withdraws it, leaving the mark of a started run for the rest of its TTL
    assert values(nodes3, rl.claim_key(NAME)) == ["~t1"] * len(nodes3)
    assert rl.claimant(NAME) == Claim(None, None)
    rl.release(taken)


def _attempt(rl, task_id: str, claim: str = "take", own_claim: bool = True):
    """An acquire by the task ``task_id``; a lease it gets is released at once."""
    got = rl.try_acquire(
        NAME, ttl=10, owner=make_owner(task_id), task_id=task_id, claim=claim, own_claim=own_claim
    )
    if isinstance(got, Lease):
        rl.release(got, withdraw_claim=claim == "check")
    return got


def test_a_replaced_message_knows_it_was_superseded(rl):
    rl.claim_next(NAME, "t1", ttl=30)
    rl.claim_next(NAME, "t2", ttl=30, replace=True)
    assert _attempt(rl, "t1") == Claim("t2", ANY)
    assert isinstance(_attempt(rl, "t2"), Lease)
    # After its successor started (the mark), it still learns who ran in its place...
    assert _attempt(rl, "t1") == Claim("t2", ANY)
    # ...while a message that was never claimed sees no claim at all, and runs.
    assert isinstance(_attempt(rl, "t3", own_claim=False), Lease)
    # A new call claims over the mark.
    assert rl.claim_next(NAME, "t4", ttl=30).claimant == "t4"
    rl.withdraw_claim(NAME, "t4")
    # A claimed message whose claim is gone altogether (it lapsed, or was never
    # written on these nodes) was replaced by nobody: it runs.
    assert isinstance(_attempt(rl, "t5"), Lease)
    # Under "check" (until_finished) too; the mark a successor leaves at its end
    # tells the message it replaced who ran in its place.
    rl.claim_next(NAME, "t6", ttl=30)
    rl.claim_next(NAME, "t7", ttl=30, replace=True)
    assert isinstance(_attempt(rl, "t7", "check", own_claim=False), Lease)
    assert _attempt(rl, "t6", "check") == Claim("t7", ANY)
    assert isinstance(_attempt(rl, "t8", "check", own_claim=False), Lease)


def test_a_holder_carries_the_claimant_seen_beside_it(rl):
    running = rl.try_acquire(NAME, ttl=10, owner=make_owner("t0"))
    assert isinstance(running, Lease)
    rl.claim_next(NAME, "t1", ttl=30)
    blocked = rl.try_acquire(NAME, ttl=10, owner=make_owner("t1"), task_id="t1", claim="take")
    assert isinstance(blocked, Holder)
    assert blocked.task_id == "t0" and blocked.claimant == "t1"
    assert rl.claimant(NAME).claimant == "t1"  # not granted: the claim stays
    rl.release(running)


def test_receipt_written_on_release_and_read_on_acquire(rl, nodes3):
    lease = rl.try_acquire(NAME, ttl=10, owner=make_owner("t1"), task_id="t1", receipts=True)
    assert isinstance(lease, Lease) and lease.task_id == "t1"
    rl.release(lease, receipt=60)
    receipt = rl.receipt_key(NAME, "t1")
    assert values(nodes3, receipt) == ["1"] * len(nodes3)
    with nodes3[0].client() as c:
        assert 55_000 < c.pttl(receipt) <= 60_000

    copy = rl.try_acquire(NAME, ttl=10, owner=make_owner("t1"), task_id="t1", receipts=True)
    assert copy == Finished("t1")
    assert values(nodes3, rl.keys(NAME)[0]) == [None] * len(nodes3)

    fresh = rl.try_acquire(NAME, ttl=10, owner=make_owner("t2"), task_id="t2", receipts=True)
    assert isinstance(fresh, Lease)
    rl.release(fresh)


def test_one_node_with_the_receipt_is_enough(rl, nodes3):
    with nodes3[-1].client() as c:
        c.set(rl.receipt_key(NAME, "t1"), "1", px=60_000)
    copy = rl.try_acquire(NAME, ttl=10, owner=make_owner("t1"), task_id="t1", receipts=True)
    assert copy == Finished("t1")
    assert values(nodes3, rl.keys(NAME)[0]) == [None] * len(nodes3)


def test_claims_need_a_quorum(redis_node_factory):
    nodes = redis_node_factory(3)
    rl = Redlock(nodes.urls, key_prefix="crl-claims")
    nodes.kill(0)
    assert rl.claim_next(NAME, "t1", ttl=30).claimant == "t1"
    nodes.kill(1)
    with pytest.raises(QuorumUnavailable):
        rl.claim_next(NAME, "t2", ttl=30)
    with pytest.raises(QuorumUnavailable):
        rl.claimant(NAME)
    assert rl.withdraw_claim(NAME, "t1") == 1  # never raises


def test_a_renewal_short_of_a_quorum_keeps_the_claim(redis_node_factory):
    """A re-publish renews its task's claim: a round that falls short withdraws only
    what it wrote, never the claim the task already held (its key would be free)."""
    nodes = redis_node_factory(3)
    rl = Redlock(nodes.urls, key_prefix="crl-claims")
    assert rl.claim_next(NAME, "t1", ttl=30).claimant == "t1"
    nodes.pause(1)  # the two stall: each call times out, and runs once resumed
    nodes.pause(2)
    try:
        with pytest.raises(QuorumUnavailable):
            rl.claim_next(NAME, "t1", ttl=30)
    finally:
        nodes.resume(1)
        nodes.resume(2)
    assert values(nodes, rl.claim_key(NAME)) == ["t1"] * 3
    assert rl.claimant(NAME).claimant == "t1"


# -- debounce and throttle schedules -------------------------------------------------


def test_debounce_moves_the_due_time_but_not_past_the_cap(rl):
    # The cap binds a call made between cap - delay and cap after the burst's
    # first: the third comes 0.8 s in, and has 4.7 s to spare on a loaded host.
    delay, cap = 5.0, 5.5
    first = rl.debounce(NAME, "t1", delay=delay, max_delay=cap, ttl=30)
    assert first.kind == "later" and first.other is None
    time.sleep(0.3)
    second = rl.debounce(NAME, "t2", delay=delay, max_delay=cap, ttl=30)
    assert second.other == "t1"  # taken over
    assert second.due > first.due
    time.sleep(0.5)
    third = rl.debounce(NAME, "t3", delay=delay, max_delay=cap, ttl=30)
    assert third.due == pytest.approx(first.due - delay + cap, abs=0.01)  # capped by the burst
    assert rl.claimant(NAME).claimant == "t3"
    rl.withdraw_claim(NAME, "t3")
    fresh = rl.debounce(NAME, "t4", delay=delay, max_delay=cap, ttl=30)
    assert fresh.other is None and fresh.due > third.due  # a new burst


def test_throttle_runs_the_first_at_once_and_trails_the_rest(rl):
    # the four calls fall in one period however slowly a loaded host makes them
    now = rl.throttle(NAME, "t1", period=PERIOD, trailing=True, ttl=30)
    assert now.kind == "now" and rl.claimant(NAME).claimant is None
    trail = rl.throttle(NAME, "t2", period=PERIOD, trailing=True, ttl=30)
    assert trail.kind == "later" and trail.due == pytest.approx(now.due + PERIOD, abs=0.01)
    again = rl.throttle(NAME, "t3", period=PERIOD, trailing=True, ttl=30)
    assert again.kind == "later" and again.other == "t2" and again.due == trail.due
    dropped = rl.throttle(NAME, "t4", period=PERIOD, trailing=False, ttl=30)
    assert dropped.kind == "dropped" and dropped.other == "t3"


def test_a_throttled_start_waits_for_its_period(rl):
    began = time.monotonic()
    first = rl.try_acquire(NAME, ttl=5, owner=make_owner("t1"), task_id="t1", throttle=1.0)
    assert isinstance(first, Lease)
    rl.release(first)
    early = rl.try_acquire(NAME, ttl=5, owner=make_owner("t2"), task_id="t2", throttle=1.0)
    # the period less what passed since the first start (on a loaded host, more
    # than a guess would allow), less 10 ms of the clocks' rounding
    passed = time.monotonic() - began
    assert isinstance(early, TooEarly) and 1.0 - passed - 0.01 <= early.wait <= 1.0
    time.sleep(early.wait)
    later = rl.try_acquire(NAME, ttl=5, owner=make_owner("t2"), task_id="t2", throttle=1.0)
    assert isinstance(later, Lease)
    rl.release(later)


def test_a_throttled_slot_taken_over_is_reported_at_the_start(rl):
    rl.throttle(NAME, "t1", period=PERIOD, trailing=True, ttl=30)  # runs now
    first = rl.throttle(NAME, "t2", period=PERIOD, trailing=True, ttl=30)
    second = rl.throttle(NAME, "t3", period=PERIOD, trailing=True, ttl=30)
    assert first.slot == second.slot and second.other == "t2"
    time.sleep(first.due - time.time())
    lost = rl.try_acquire(
        NAME, ttl=5, owner=make_owner("t2"), task_id="t2", throttle=PERIOD, slot=first.slot
    )
    assert lost == Claim("t3", None)
    won = rl.try_acquire(
        NAME, ttl=5, owner=make_owner("t3"), task_id="t3", throttle=PERIOD, slot=second.slot
    )
    assert isinstance(won, Lease)
    rl.release(won)
    # A call made after the slot's time but before its run started plans the next slot,
    # and leaves the due one to its run.
    nxt = rl.throttle(NAME, "t4", period=PERIOD, trailing=True, ttl=30)
    assert nxt.kind == "later" and nxt.slot != second.slot and nxt.other is None
