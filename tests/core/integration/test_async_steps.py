"""AsyncRedlock's claims, lock reads and queues on real Redis nodes: the sync
client's steps driven on the loop (no carrier thread), with the same results as
the sync client's on the same keys, both ways."""

from __future__ import annotations

import asyncio
import time

import pytest

from celery_redlock import AsyncRedlock, Redlock
from celery_redlock.core import aio as core_aio
from celery_redlock.core.nodes import aio as nodes_aio

pytestmark = pytest.mark.integration


@pytest.fixture
def no_carrier(monkeypatch):
    """Any call carried in the thread pool fails the test."""

    def refused():
        raise AssertionError("a round ran in the carrier threads, not on the loop")

    monkeypatch.setattr(core_aio, "carrier", refused)
    monkeypatch.setattr(nodes_aio, "carrier", refused)


def test_claims_run_on_the_loop_and_agree_with_the_sync_client(redis_nodes3, no_carrier):
    rl, sync = AsyncRedlock(redis_nodes3.urls), Redlock(redis_nodes3.urls)

    async def main() -> None:
        assert await rl.claim("once", "a", ttl=5)
        assert not await rl.claim("once", "b", ttl=5)
        mine = await rl.claim_next("next", "t1", ttl=5)
        assert mine.claimant == "t1"
        other = await rl.claim_next("next", "t2", ttl=5)  # another claimant's: it stays
        assert other.claimant == "t1" and 0 < other.remaining <= 5
        taken = await rl.claim_next("next", "t2", ttl=5, replace=True)
        assert taken.claimant == "t2" and taken.previous == "t1"
        assert (await rl.claimant("next")).claimant == "t2"
        assert await rl.withdraw_claim("next", "t2") == 3
        assert (await rl.claimant("next")).claimant is None

    asyncio.run(main())
    assert not sync.claim("once", "c", ttl=5)  # the async claim holds for the sync client
    assert sync.claim_next("both", "s1", ttl=5).claimant == "s1"

    async def then() -> None:
        assert (await rl.claimant("both")).claimant == "s1"  # and the other way round

    asyncio.run(then())


def test_debounce_and_throttle_plan_on_the_loop_as_the_sync_client_does(redis_nodes3, no_carrier):
    rl, sync = AsyncRedlock(redis_nodes3.urls), Redlock(redis_nodes3.urls)
    before = time.time()
    first = sync.debounce("burst", "c1", delay=1.0, max_delay=None, ttl=5)

    async def main() -> None:
        later = await rl.debounce("burst", "c2", delay=1.0, max_delay=None, ttl=5)
        assert later.kind == "later" and later.other == "c1"  # it replaced the sync call
        assert later.due >= first.due and later.due <= time.time() + 1.0 + 0.01
        assert (await rl.claimant("burst")).claimant == "c2"
        now = await rl.throttle("rated", "t1", period=10, trailing=True, ttl=5)
        assert now.kind == "now"
        trailing = await rl.throttle("rated", "t2", period=10, trailing=True, ttl=5)
        assert trailing.kind == "later" and trailing.due >= before + 10

    asyncio.run(main())
    assert sync.claimant("burst").claimant == "c2"
    dropped = sync.throttle("rated", "t3", period=10, trailing=False, ttl=5)
    assert dropped.kind == "dropped"


def test_lock_reads_run_on_the_loop(redis_nodes3, no_carrier):
    rl, sync = AsyncRedlock(redis_nodes3.urls), Redlock(redis_nodes3.urls)
    lease = sync.acquire("seen", ttl=10)
    assert lease is not None

    async def main() -> None:
        holder = await rl.holder("seen")
        assert holder.owner == lease.owner and 0 < holder.remaining <= 10
        views = await rl.inspect("seen")
        assert [v["holder"] for v in views] == [lease.owner] * 3
        assert {v["fence"] for v in views} == {str(lease.fencing_token)}
        key, fence_key = rl.keys("seen")
        keyed = await rl.inspect_key(key, fence_key)
        assert [v.holder for v in keyed] == [lease.owner] * 3

    asyncio.run(main())


def test_a_claim_read_and_a_force_release_are_the_sync_clients(redis_nodes3):
    """Their rounds are plain reads and deletes (carried, see nodes.aio); their logic
    is the same steps."""
    rl, sync = AsyncRedlock(redis_nodes3.urls), Redlock(redis_nodes3.urls)
    lease = sync.acquire("stuck", ttl=10)
    assert lease is not None
    sync.claim("beat:slot", "sent", ttl=10)

    async def main() -> None:
        assert (await rl.read_claim("beat:slot")).value == "sent"
        deleted = await rl.force_release("stuck")
        assert [d.deleted for d in deleted] == [True] * 3
        assert (await rl.holder("stuck")).owner is None

    asyncio.run(main())
    assert sync.holder("stuck").owner is None


def test_a_queue_parks_and_hands_over_on_the_loop(redis_nodes3, no_carrier):
    rl, sync = AsyncRedlock(redis_nodes3.urls), Redlock(redis_nodes3.urls)
    assert sync.park("line", "q1", "call-1", most=0, retention=10).position == 1

    async def main() -> None:
        second = await rl.park("line", "q2", "call-2", most=0, retention=10)
        assert second.parked and second.position == 2
        full = await rl.park("line", "q3", "call-3", most=2, retention=10)
        assert not full.parked and full.waiting == 2
        view = await rl.queue_peek("line")
        assert view.waiting == 2 and view.next == "q1" and view.call == "call-1"
        handed = await rl.queue_next("line", claim_ttl=5)
        assert handed.state == "handed" and handed.id == "q1" and handed.call == "call-1"
        assert (await rl.claimant("line")).claimant == "q1"

    asyncio.run(main())
    assert sync.claimant("line").claimant == "q1"
    after = sync.queue_next("line", drop="q1", claim_ttl=5)  # q1 started: q2 is next
    assert after.removed == 3 and after.id == "q2"


def test_permits_are_taken_on_the_loop_and_shared_with_the_sync_client(redis_nodes3, no_carrier):
    rl, sync = AsyncRedlock(redis_nodes3.urls), Redlock(redis_nodes3.urls)
    first = sync.try_acquire("pool", ttl=10, limit=2)
    assert first.permit == 0

    async def main() -> None:
        second = await rl.try_acquire("pool", ttl=10, limit=2)
        assert second.permit == 1 and second.fencing_token > first.fencing_token
        full = await rl.try_acquire("pool", ttl=10, limit=2)
        assert full.owner in (first.owner, second.owner)  # held: the Holder in the way
        both = await rl.try_acquire("pair", ttl=10, limit=3, also=[("pool-b", 1)])
        assert both.also and both.also[0].name == "pool-b"
        await rl.release(second)
        await rl.release(both)

    asyncio.run(main())
    assert sync.try_acquire("pool-b", ttl=10).fencing_token > 0  # released with its pair
