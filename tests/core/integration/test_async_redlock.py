"""AsyncRedlock on real Redis and PostgreSQL nodes: the core's steps driven from one loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from celery_redlock import AsyncRedlock, Holder, Lease, Redlock
from celery_redlock.exceptions import LockContended

pytestmark = pytest.mark.integration


def take_turns(rl: AsyncRedlock, name: str, callers: int, each: int = 1) -> tuple[int, list[int]]:
    """``callers`` coroutines on one loop, ``each`` turns each holding ``name``: the
    most inside at once and the tokens in grant order. Asserts the thread count
    stayed flat: no round ran in a thread."""
    inside = most = 0
    tokens: list[int] = []
    threads: list[int] = []

    async def one() -> None:
        nonlocal inside, most
        for _ in range(each):
            async with rl.lock(name, ttl=10, timeout=120) as lease:
                inside += 1
                most = max(most, inside)
                tokens.append(lease.fencing_token)
                threads.append(threading.active_count())
                await asyncio.sleep(0.002)
                inside -= 1

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(callers)))

    before = threading.active_count()
    asyncio.run(main())
    assert max(threads) - before <= 2, "the rounds run on the loop, not in threads"
    return most, tokens


def test_a_hundred_coroutines_on_one_loop_take_turns_with_growing_tokens(redis_nodes3):
    most, tokens = take_turns(AsyncRedlock(redis_nodes3.urls), "hundred", 100)
    assert most == 1
    assert len(tokens) == 100
    assert all(a < b for a, b in zip(tokens, tokens[1:])), "tokens grow in grant order"


def test_the_asyncio_heartbeat_keeps_a_short_lease_a_sync_client_never_takes(redis_nodes3):
    rl = AsyncRedlock(redis_nodes3.urls)
    sync = Redlock(redis_nodes3.urls)
    seen: list[object] = []
    stop = threading.Event()

    def contend() -> None:
        while not stop.wait(0.5):
            seen.append(sync.try_acquire("kept", ttl=1))

    async def main() -> Lease:
        async with rl.lock("kept", ttl=1) as lease:
            thread = threading.Thread(target=contend)
            thread.start()
            try:
                await asyncio.sleep(3.5)
                assert not lease.lost
                lease.check()
            finally:
                stop.set()
                await asyncio.get_running_loop().run_in_executor(None, thread.join)
            return lease

    lease = asyncio.run(main())
    assert len(seen) >= 3
    assert all(isinstance(r, Holder) and r.owner == lease.owner for r in seen), seen
    assert isinstance(sync.try_acquire("kept", ttl=1), Lease), "released after the block"


def alternate(sync: Redlock, rl: AsyncRedlock, name: str, turns: int = 2) -> list[int]:
    """Sync and async holders in turn, each seeing the other hold: the tokens in order,
    asserted strictly growing (one sequence)."""

    async def main() -> list[int]:
        tokens = []
        for _ in range(turns):
            held = await asyncio.get_running_loop().run_in_executor(
                None, lambda: sync.acquire(name, ttl=5)
            )
            assert held is not None
            tokens.append(held.fencing_token)
            got = await rl.try_acquire(name, ttl=5)
            assert isinstance(got, Holder) and got.owner == held.owner
            sync.release(held)
            lease = await rl.acquire(name, ttl=5)
            assert lease is not None
            tokens.append(lease.fencing_token)
            other = sync.try_acquire(name, ttl=5)
            assert isinstance(other, Holder) and other.owner == lease.owner
            assert await rl.extend(lease, 4)
            await rl.release(lease)
        return tokens

    tokens = asyncio.run(main())
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens
    return tokens


@pytest.mark.parametrize("fleet", ["redis_nodes3", "postgres_node1"])
def test_sync_and_async_exclude_each_other_and_share_one_token_sequence(fleet, request):
    nodes = request.getfixturevalue(fleet)
    # the test is of exclusion and tokens: a loaded host's slow call is not an outage here
    sync, aio = Redlock(nodes.urls, node_timeout=2.0), AsyncRedlock(nodes.urls, node_timeout=2.0)
    assert len(alternate(sync, aio, "both", 3)) == 6


def test_an_async_lock_held_by_another_raises_contended_naming_the_holder(redis_nodes3):
    held = Redlock(redis_nodes3.urls).acquire("taken", ttl=10)
    assert held is not None
    rl = AsyncRedlock(redis_nodes3.urls)

    async def main() -> None:
        async with rl.lock("taken", ttl=5, timeout=0.2):
            raise AssertionError("the lock is held by another")

    with pytest.raises(LockContended) as raised:
        asyncio.run(main())
    assert raised.value.holder == held.owner and 0 < raised.value.remaining <= 10
    Redlock(redis_nodes3.urls).release(held)


def test_a_lazy_token_is_issued_on_the_loop_and_carried_calls_answer(redis_nodes3):
    rl = AsyncRedlock(redis_nodes3.urls)

    async def main() -> None:
        lease = await rl.acquire("lazy", ttl=5, fence=False)
        assert lease is not None
        token = await rl.fencing_token(lease)
        assert token == lease.fencing_token and token > 0
        holder = await rl.holder("lazy")  # a carried sync call
        assert holder.owner == lease.owner
        await rl.release(lease)
        assert (await rl.holder("lazy")).owner is None

    asyncio.run(main())


def test_a_round_with_a_dead_node_is_decided_by_the_quorum(redis_nodes3):
    rl = AsyncRedlock(redis_nodes3.urls)
    redis_nodes3.pause(0)  # a node that accepts and never answers

    async def main() -> float:
        start = time.monotonic()
        lease = await rl.acquire("dead-minority", ttl=5)
        took = time.monotonic() - start
        assert lease is not None
        await rl.release(lease)
        return took

    assert asyncio.run(main()) < 1.0


def test_forty_coroutines_on_a_postgresql_node_take_turns_on_the_loop(postgres_node1, monkeypatch):
    from celery_redlock.core.nodes import aio

    carried: list[object] = []
    monkeypatch.setattr(aio, "carrier", lambda: carried.append(1))  # a round there would fail
    most, tokens = take_turns(AsyncRedlock(postgres_node1.urls), "forty", 40)
    assert most == 1 and len(tokens) == 40
    assert all(a < b for a, b in zip(tokens, tokens[1:])), "tokens grow in grant order"
    assert not carried, "PostgreSQL rounds run on the loop, not in the carrier threads"


def test_transaction_pooling_keeps_exclusion_and_growing_tokens_on_the_loop(postgres_node1):
    """pgbouncer with two server connections in transaction pooling: a statement
    prepared on one server connection may be missing on the other, and the call
    then goes unprepared, as the sync node's does."""
    from celery_redlock.testing.pgbouncer import PgBouncer

    with PgBouncer(postgres_node1[0], pool_size=2) as bouncer:
        rl = AsyncRedlock([bouncer.url], node_timeout=1.0)
        most, tokens = take_turns(rl, "pooled", 6, each=10)
    assert most == 1 and len(tokens) == 60
    assert all(a < b for a, b in zip(tokens, tokens[1:])), "tokens grow in grant order"


def test_a_flushed_script_cache_and_another_db_are_served(redis_nodes3):
    urls = [url.rsplit("/", 1)[0] + "/2" for url in redis_nodes3.urls]
    rl = AsyncRedlock(urls)
    sync = Redlock(urls)

    async def main() -> None:
        first = await rl.acquire("flushed", ttl=5)
        assert first is not None
        for node in redis_nodes3:
            with node.client() as client:
                client.script_flush()  # EVALSHA gets NOSCRIPT: EVAL follows
        assert await rl.extend(first)
        held = sync.try_acquire("flushed", ttl=5)
        assert isinstance(held, Holder) and held.owner == first.owner
        await rl.release(first)
        for node in redis_nodes3:
            with node.client(db=2) as client:
                assert client.exists(sync.keys("flushed")[1])  # the fence key, in db 2

    asyncio.run(main())
