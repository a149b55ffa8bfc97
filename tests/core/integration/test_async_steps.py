"""AsyncRedlock's claims on real Redis nodes: the sync client's steps driven on the
loop (no carrier thread), and the same claims as the sync client's, both ways."""

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
        raise AssertionError("a claim's round ran in the carrier threads, not on the loop")

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
