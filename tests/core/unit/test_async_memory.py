"""AsyncRedlock on memory nodes: the same steps, the memory kind on the loop, a
hung node carried in a thread and cut once a quorum answered."""

from __future__ import annotations

import asyncio
import time

import pytest

from celery_redlock import AsyncRedlock, Holder, Lease, LockNotAcquired, QuorumUnavailable, Redlock
from celery_redlock.testing.memory import MemoryNodes


def test_acquire_extend_release_and_the_sync_client_sees_it():
    with MemoryNodes(3) as nodes:
        rl, sync = AsyncRedlock(nodes.urls), Redlock(nodes.urls)

        async def main() -> None:
            lease = await rl.acquire("m", ttl=5)
            assert isinstance(lease, Lease) and lease.fencing_token
            assert isinstance(sync.try_acquire("m", ttl=5), Holder)
            assert await rl.extend_many([lease], 3) == [True]
            await rl.release(lease)
            assert not (await rl.extend(lease))
            again = sync.acquire("m", ttl=5)
            assert again is not None and again.fencing_token > lease.fencing_token

        asyncio.run(main())


def test_a_hung_minority_does_not_hold_the_round_and_a_dead_majority_raises():
    with MemoryNodes(3) as nodes:
        rl = AsyncRedlock(nodes.urls, node_timeout=2.0)
        nodes.pause(0)

        async def quick() -> float:
            start = time.monotonic()
            lease = await rl.acquire("hung", ttl=5)
            assert lease is not None
            return time.monotonic() - start

        try:
            assert asyncio.run(quick()) < 1.5
        finally:
            nodes.resume(0)
        nodes.kill(1)
        nodes.kill(2)
        with pytest.raises(QuorumUnavailable):
            asyncio.run(rl.try_acquire("dead", ttl=5))


def test_lock_times_out_with_the_sync_clients_error_and_the_heartbeat_renews():
    with MemoryNodes(3) as nodes:
        rl, sync = AsyncRedlock(nodes.urls), Redlock(nodes.urls)
        held = sync.acquire("busy", ttl=5)

        async def main() -> None:
            with pytest.raises(LockNotAcquired):
                async with rl.lock("busy", ttl=1, timeout=0.2):
                    raise AssertionError("not held")
            async with rl.lock("short", ttl=0.3) as lease:
                await asyncio.sleep(0.8)
                lease.check()

        asyncio.run(main())
        assert held is not None


def test_the_async_client_needs_its_nodes():
    with pytest.raises(TypeError, match="nodes"):
        AsyncRedlock()
