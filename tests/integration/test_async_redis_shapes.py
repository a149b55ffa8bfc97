"""AsyncRedlock on the Redis shapes beyond a plain master, natively on the loop:
TLS (``rediss://``), ``min_replicas``, Sentinel and a Cluster's one-name calls,
each against real servers (:mod:`tests.support.deploy`, the Cluster fixtures).
For each: no round goes to the carrier threads, sync and async clients exclude
each other with one token sequence, and the failure case gives what the sync
client gives (a Cluster's redirects are its sync round, carried)."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.crc import key_slot

from celery_redlock import AsyncRedlock, Holder, Lease, Redlock
from celery_redlock.core.nodes import aio
from celery_redlock.exceptions import QuorumUnavailable, heals
from tests.core.integration.test_async_redlock import alternate
from tests.support import deploy
from tests.support.polling import wait_for

pytestmark = pytest.mark.integration

#: A TLS handshake with client certificates on a loaded 2-core host outlasted 1 s.
HANDSHAKE = 5.0
#: Generous for a loaded host; a WAIT that falls short answers at the next tick.
TIMEOUT = 0.3


@pytest.fixture
def uncarried(monkeypatch):
    """Fails a test whose round would go to the carrier threads."""
    carried: list[int] = []
    monkeypatch.setattr(aio, "carrier", lambda: carried.append(1))  # a round there would fail
    yield
    assert not carried, "the rounds run on the loop, not in the carrier threads"


def refusal(attempt) -> dict:
    """node -> (error type, heals) of the QuorumUnavailable ``attempt`` raises."""
    with pytest.raises(QuorumUnavailable) as caught:
        attempt()
    return {node: (type(e), heals(e)) for node, e in caught.value.errors.items()}


# -- TLS ---------------------------------------------------------------------------------------

TLS_BINARY = deploy.tls_binary()
needs_tls = pytest.mark.skipif(
    TLS_BINARY is None, reason="no redis-server built with TLS (Debian: redis-server)"
)


@pytest.fixture(scope="module")
def tls_nodes(tmp_path_factory):
    pytest.importorskip("trustme", reason="the TLS tests make their certificates with trustme")
    certs = deploy.Certificates(str(tmp_path_factory.mktemp("certs")))
    started = [deploy.tls_node(TLS_BINARY, certs) for _ in range(3)]
    yield certs, started
    for node, _ in started:
        node.close()


@needs_tls
def test_tls_nodes_are_native_and_exclude_the_sync_client(tls_nodes, uncarried):
    certs, started = tls_nodes
    urls = [deploy.tls_url(port, certs) for _, port in started]
    sync = Redlock(urls, node_timeout=0.5, connect_timeout=HANDSHAKE)
    rl = AsyncRedlock(redlock=sync)
    assert all(aio.native(node) and not node.lean for node in sync.nodes)
    alternate(sync, rl, "tls")


@needs_tls
def test_a_wrong_ca_cannot_heal_as_for_the_sync_client(tls_nodes, uncarried):
    certs, started = tls_nodes
    port = started[0][1]
    url = deploy.tls_url(port, certs, ca=certs.other_ca)
    sync = Redlock([url], node_timeout=5.0, connect_timeout=HANDSHAKE)
    rl = AsyncRedlock(redlock=sync)
    by_sync = refusal(lambda: sync.try_acquire("job", ttl=5))
    start = time.monotonic()
    with pytest.raises(QuorumUnavailable) as caught:
        asyncio.run(rl.try_acquire("job", ttl=5))
    assert time.monotonic() - start < 5.0  # at the handshake's verdict
    assert {n: (type(e), heals(e)) for n, e in caught.value.errors.items()} == by_sync
    assert not caught.value.heals
    text = str(caught.value)
    assert f"127.0.0.1:{port}" in text and "CERTIFICATE_VERIFY_FAILED" in text
    assert deploy.ACL_PASSWORD not in text


# -- min_replicas ------------------------------------------------------------------------------


@pytest.fixture
def pair():
    nodes = deploy.primary_with_replicas(1)
    yield nodes
    for node in nodes:
        node.close()


def test_replica_confirmed_grants_are_native_and_exclude_the_sync_client(pair, uncarried):
    primary, replica = pair
    sync = Redlock([primary.url], node_timeout=TIMEOUT, min_replicas=1)
    rl = AsyncRedlock(redlock=sync)
    assert aio.native(sync.nodes[0])
    alternate(sync, rl, "confirmed")

    async def confirmed() -> Lease:
        lease = await rl.acquire("job", ttl=5)
        assert lease is not None
        return lease

    lease = asyncio.run(confirmed())
    with replica.client() as client:  # confirmed: on the replica when the grant returns
        assert client.get(lease.key) == lease.owner


def test_a_silent_replica_makes_the_node_not_count_as_for_the_sync_client(pair, uncarried):
    primary, replica = pair
    sync = Redlock([primary.url], node_timeout=TIMEOUT, min_replicas=1)
    rl = AsyncRedlock(redlock=sync)
    held = asyncio.run(rl.acquire("held", ttl=5))
    assert held is not None
    replica.pause()
    try:
        by_sync = refusal(lambda: sync.try_acquire("job", ttl=5))
        with pytest.raises(QuorumUnavailable, match="replicas confirmed") as caught:
            asyncio.run(rl.try_acquire("job", ttl=5))
        assert {n: (type(e), heals(e)) for n, e in caught.value.errors.items()} == by_sync
        with primary.client() as client:  # the unconfirmed grant withdrawn
            assert client.get(sync.keys("job")[0]) is None
        assert not asyncio.run(rl.extend(held))  # a renewal not confirmed loses the lease
        assert held.lost
    finally:
        replica.resume()


# -- Sentinel ----------------------------------------------------------------------------------


@pytest.fixture
def sentinels():
    deployment = deploy.SentinelDeployment(replicas=1, sentinels=3)
    yield deployment
    deployment.close()


def test_sentinel_nodes_are_native_and_follow_a_killed_master(sentinels, uncarried):
    sync = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=1)
    rl = AsyncRedlock(redlock=sync)
    other = AsyncRedlock([sentinels.url()], node_timeout=TIMEOUT)  # without min_replicas
    assert aio.native(sync.nodes[0]) and aio.native(other.sync.nodes[0])
    alternate(sync, rl, "sentinel")
    loop = asyncio.new_event_loop()
    try:
        lease = loop.run_until_complete(rl.acquire("job", ttl=30))
        assert lease is not None  # confirmed by the replica
        seen = loop.run_until_complete(other.try_acquire("job", ttl=30))
        assert isinstance(seen, Holder)  # both clients hold a connection to the master
        old = sentinels.primary
        old.kill()  # SIGKILL mid-hold: the loop's connections to it close
        new = sentinels.wait_for_failover(old)

        def refused() -> str:
            with pytest.raises(QuorumUnavailable) as caught:
                loop.run_until_complete(rl.try_acquire("after", ttl=10))
            return str(caught.value)

        # the same loop asks the sentinels again and reaches the new master, which
        # has no replica left to confirm: refused for that, not for the dead one
        # (a loaded host may first let the WAIT outlast the round)
        wait_for(lambda: "replicas confirmed" in refused(), timeout=10, what="the new master")
        seen = loop.run_until_complete(other.try_acquire("job", ttl=10))
        assert isinstance(seen, Holder) and seen.owner == lease.owner  # confirmed: kept
        fresh = loop.run_until_complete(other.acquire("after", ttl=10))
        assert isinstance(fresh, Lease)
        with new.client() as client:
            assert client.get(fresh.key) == fresh.owner
        loop.run_until_complete(other.release(fresh))
    finally:
        loop.close()


def test_a_demoted_master_sends_the_next_round_to_the_new_one(sentinels, uncarried):
    rl = AsyncRedlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=1)
    loop = asyncio.new_event_loop()
    try:
        lease = loop.run_until_complete(rl.acquire("job", ttl=30))
        assert lease is not None
        new = sentinels.fail_over()
        assert loop.run_until_complete(rl.extend(lease))  # one call: no round lost to the move
        with new.client() as client:
            assert client.get(lease.key) == lease.owner
        loop.run_until_complete(rl.release(lease))
    finally:
        loop.close()


def test_a_readonly_reply_drops_the_connection_and_asks_the_sentinels_again(sentinels, uncarried):
    from celery_redlock.core.nodes import resp

    rl = AsyncRedlock([sentinels.url()], node_timeout=TIMEOUT)
    (node,) = rl.sync.nodes
    replica = next(n for n in sentinels.data if n is not sentinels.primary)

    async def main() -> None:
        # as if the master had moved under the loop's connection
        stale = await resp._open(node.pool, node.name, 1.0, (replica.host, replica.port))
        resp._conns.setdefault(asyncio.get_running_loop(), {})[id(node)] = stale
        with pytest.raises(QuorumUnavailable, match="replica now"):
            await rl.try_acquire("job", ttl=10)
        assert stale.closed
        lease = await rl.try_acquire("job", ttl=10)  # a new connection, to the master
        assert isinstance(lease, Lease)
        await rl.release(lease)

    asyncio.run(main())


# -- Redis Cluster -----------------------------------------------------------------------------


def test_cluster_one_name_calls_go_to_their_shard_on_the_loop(redis_clusters3, monkeypatch):
    sync = Redlock(redis_clusters3.urls, node_timeout=0.5)
    rl = AsyncRedlock(redlock=sync)
    sync.release(sync.acquire("warm", ttl=5))  # the slot maps read (in the sync round)
    carried: list[int] = []
    monkeypatch.setattr(aio, "carrier", lambda: carried.append(1))  # a round there would fail
    assert all(aio.native(node) for node in sync.nodes)
    alternate(sync, rl, "cluster")
    assert not carried, "one-name calls run on the loop, not in the carrier threads"


def test_cluster_ask_and_moved_are_followed_by_the_carried_round(redis_clusters3, monkeypatch):
    sync = Redlock(redis_clusters3.urls, node_timeout=0.5)
    rl = AsyncRedlock(redlock=sync)
    lease = sync.acquire("moving", ttl=30)
    slot = key_slot(sync.keys("moving")[0].encode())
    cluster = redis_clusters3[0]
    to = next(m for m in cluster.masters if m is not cluster.master_of(slot))
    carried: list[int] = []
    real = aio.carrier
    monkeypatch.setattr(aio, "carrier", lambda: carried.append(1) or real())
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(rl.extend(lease, 30))
        assert not carried  # on the loop while the map holds
        source = cluster.begin_reshard(slot, to)
        assert cluster.move_keys(slot, source, to) == 2  # the lock and the fence
        assert loop.run_until_complete(rl.extend(lease, 30))  # ASK: followed in the sync round
        assert len(carried) == 1
        assert cluster.finish_reshard(slot, source, to) == 0
        assert loop.run_until_complete(rl.extend(lease, 30))  # MOVED: the map read again
        assert len(carried) == 2 and not lease.lost
        assert loop.run_until_complete(rl.extend(lease, 30))  # the new map: on the loop again
        assert len(carried) == 2
        other = sync.try_acquire("moving", ttl=5)
        assert isinstance(other, Holder) and other.owner == lease.owner
        loop.run_until_complete(rl.release(lease))
    finally:
        loop.close()


def test_a_killed_shard_master_is_found_again_through_the_slot_map(
    redis_cluster_factory, monkeypatch
):
    cluster = redis_cluster_factory(3, replicas=1)
    owner = AsyncRedlock([cluster.url], node_timeout=0.5, min_replicas=1)
    other = AsyncRedlock([cluster.url], node_timeout=0.5)  # the promoted master has no replica
    carried: list[int] = []
    real = aio.carrier
    monkeypatch.setattr(aio, "carrier", lambda: carried.append(1) or real())
    for rl in (owner, other):
        rl.sync.release(rl.sync.acquire("warm", ttl=5))  # the slot maps read
    loop = asyncio.new_event_loop()
    try:
        held = loop.run_until_complete(owner.acquire("held", ttl=30))
        assert held is not None  # confirmed by the shard's replica
        seen = loop.run_until_complete(other.try_acquire("held", ttl=5))
        assert isinstance(seen, Holder) and not carried  # a connection to the old master
        slot = key_slot(owner.sync.keys("held")[0].encode())
        promoted = cluster.kill_master(cluster.masters.index(cluster.master_of(slot)))

        def holder() -> object:
            try:  # a shard that fails has the map read again in the background
                return loop.run_until_complete(other.try_acquire("held", ttl=5))
            except QuorumUnavailable:
                return None

        seen = wait_for(holder, timeout=20, what="the promoted replica to answer")
        assert isinstance(seen, Holder) and seen.owner == held.owner  # WAIT had it there
        with promoted.client() as client:
            assert client.get(held.key) == held.owner
        before = len(carried)
        fresh = loop.run_until_complete(other.acquire("held-next", ttl=5))
        assert fresh is not None and loop.run_until_complete(other.extend(fresh))
        loop.run_until_complete(other.release(fresh))
        assert len(carried) == before, "on the loop again, to the new master"
    finally:
        loop.close()
