"""Lock nodes that are Redis Clusters, through what moves a cluster: a reshard
of a hot key's slot during a run, a shard master's failover, and the routing
of one name to one shard (each cluster is one lock node of the quorum)."""

from __future__ import annotations

import threading
import time

import pytest
from redis.crc import key_slot

from celery_redlock.core import ConfigurationError, Lease, Redlock
from celery_redlock.core.heartbeat import Heartbeat
from celery_redlock.core.nodes.redis import rounds as core_rounds
from tests.support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

HOT = "hot"


@pytest.fixture
def timed_rounds(monkeypatch):
    """The durations of every round that reached a cluster node (the MOVED or
    ASK it followed included)."""
    durations: list[float] = []
    spread = core_rounds._spread_script

    def timed(*args, **kwargs):
        started = time.monotonic()
        try:
            return spread(*args, **kwargs)
        finally:
            durations.append(time.monotonic() - started)

    monkeypatch.setattr(core_rounds, "_spread_script", timed)
    return durations


def run_on(rl: Redlock, name: str, seconds: float = 60.0, threads: int = 4) -> dict:
    """Threads take ``name`` and let it go until :func:`finish` (or ``seconds``, a
    failsafe): the grants' tokens in grant order, how many held it at once at most,
    and the errors."""
    inside = peak = 0
    tokens: list[int] = []
    errors: list[BaseException] = []
    guard = threading.Lock()
    end = time.monotonic() + seconds
    stop = threading.Event()

    def loop() -> None:
        nonlocal inside, peak
        try:
            while time.monotonic() < end and not stop.is_set():
                lease = rl.try_acquire(name, ttl=5)
                if not isinstance(lease, Lease):
                    time.sleep(0.001)
                    continue
                with guard:
                    inside += 1
                    peak = max(peak, inside)
                    tokens.append(lease.fencing_token)
                time.sleep(0.002)
                with guard:
                    inside -= 1
                rl.release(lease)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for t in pool:
        t.start()
    return {"threads": pool, "tokens": tokens, "peak": lambda: peak, "errors": errors, "stop": stop}


def finish(run: dict, more: int = 20) -> None:
    """End the run once it has made ``more`` grants from now on: it went on."""
    seen = len(run["tokens"])
    alive = run["threads"]
    wait_for(lambda: len(run["tokens"]) >= seen + more or not any(t.is_alive() for t in alive), 30)
    run["stop"].set()
    for t in alive:
        t.join(60)


def test_one_name_goes_to_one_shard_and_names_spread_over_every_shard(redis_clusters3):
    rl = Redlock(redis_clusters3.urls)
    leases = [rl.acquire(f"spread-{i}", ttl=10) for i in range(60)]
    for cluster in redis_clusters3:
        per_shard = []
        for master in cluster.masters:
            with master.client() as c:
                per_shard.append(len(list(c.scan_iter("redlock:lock:*"))))
        assert sum(per_shard) == 60 and all(per_shard), per_shard
    for lease in leases:
        rl.release(lease)
    assert redis_clusters3.keys("redlock:lock:*") == {0: [], 1: [], 2: []}


def test_a_cluster_url_must_name_hosts_and_database_0(redis_clusters3):
    with pytest.raises(ConfigurationError, match="not host:port"):
        Redlock(["redis+cluster://127.0.0.1"])
    with pytest.raises(ConfigurationError, match="database 0 only"):
        Redlock([redis_clusters3[0].url + "/3"])
    with pytest.raises(ConfigurationError, match="listed twice"):
        Redlock([redis_clusters3[0].url, redis_clusters3[0].url])


def test_a_redis_cluster_client_is_a_node(redis_clusters3):
    clients = [cluster.client(decode_responses=False) for cluster in redis_clusters3]
    rl = Redlock(clients)
    lease = rl.acquire("client-node", ttl=5)
    assert lease is not None and rl.holder("client-node").owner == lease.owner
    rl.release(lease)
    for client in clients:
        client.close()


def test_a_reshard_of_a_hot_slot_during_a_run_loses_nothing(redis_clusters3, timed_rounds):
    budget = 1.0  # rounds take milliseconds: the margin is for a loaded host
    rl = Redlock(redis_clusters3.urls, node_timeout=budget)
    lock_key, fence_key = rl.keys(HOT)
    slot = key_slot(lock_key.encode())
    run = run_on(rl, HOT)
    moved = []
    for cluster in list(redis_clusters3)[:2]:  # two of the three nodes reshard, one after the other
        time.sleep(0.5)
        to = next(m for m in cluster.masters if m is not cluster.master_of(slot))
        source = cluster.begin_reshard(slot, to)
        time.sleep(0.3)  # a while of ASK: the slot is half here, half there
        moved.append(cluster.finish_reshard(slot, source, to))
        assert cluster.master_of(slot) is to
    finish(run)
    tokens = run["tokens"]
    assert not run["errors"], run["errors"]
    assert run["peak"]() == 1  # never two holders at once
    assert len(tokens) > 20 and tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert all(moved), moved  # the fence (at least) moved with the slot: nothing was lost
    fences = []
    for cluster in redis_clusters3:
        with cluster.client() as c:
            assert c.get(lock_key) is None  # every grant was released
            fences.append(int(c.get(fence_key)))
    # the last token is on a quorum still (fence values only grow; an attempt
    # that was not granted may have moved one node's further)
    assert sum(1 for fence in fences if fence >= tokens[-1]) >= 2, (fences, tokens[-1])
    print(f"{len(tokens)} grants, {len(timed_rounds)} rounds, longest {max(timed_rounds):.3f}s")
    assert max(timed_rounds) < budget


def test_a_shard_failover_keeps_a_held_lock_and_the_run_goes_on(redis_cluster_factory):
    clusters = [redis_cluster_factory(3, replicas=1) for _ in range(3)]
    rl = Redlock([c.url for c in clusters], node_timeout=0.5, min_replicas=1)
    held = rl.acquire("held", ttl=30)
    assert held is not None
    lock_key = rl.keys("held")[0]
    first = clusters[0]
    index = first.masters.index(first.master_of(key_slot(lock_key.encode())))
    run = run_on(rl, HOT, threads=2)
    time.sleep(0.5)
    promoted = first.kill_master(index)  # SIGKILL; its replica takes over
    finish(run)
    assert not run["errors"], run["errors"]
    assert run["peak"]() == 1 and len(run["tokens"]) > 20  # the run went on
    with promoted.client() as c:
        assert c.get(lock_key) == held.owner  # WAIT had the grant on the replica
    assert rl.holder("held").owner == held.owner
    assert rl.extend(held) and not held.lost
    assert rl.try_acquire("held", ttl=5).owner == held.owner  # still held by its owner
    rl.release(held)
    assert rl.holder("held").owner is None


def test_ask_and_moved_are_followed_within_the_round(redis_clusters3):
    rl = Redlock(redis_clusters3.urls, node_timeout=0.5)
    beat = Heartbeat(autostart=False)
    held = [rl.acquire(f"moving-{i}", ttl=30) for i in range(40)]  # on every shard
    lease = rl.acquire("moving", ttl=30)
    lock_key = rl.keys("moving")[0]
    slot = key_slot(lock_key.encode())
    cluster = redis_clusters3[0]
    to = next(m for m in cluster.masters if m is not cluster.master_of(slot))

    def asked() -> int:
        with to.client() as c:
            return c.info("commandstats").get("cmdstat_asking", {}).get("calls", 0)

    source = cluster.begin_reshard(slot, to)
    assert cluster.move_keys(slot, source, to) == 2  # the lock and the fence
    # The slot is migrating and its keys are gone from the source, which
    # answers ASK: the renewal (one key) is sent again to the importing
    # master after ASKING, in the same round.
    before = asked()
    assert rl.extend(lease, 30) and not lease.lost
    assert asked() > before  # (twice if that master had not cached the script yet)
    assert cluster.finish_reshard(slot, source, to) == 0
    # The slot map is stale now: the shard that lost the slot answers MOVED
    # to its part of the batch, which is followed once after the map is read.
    for one in [lease, *held]:
        beat.hold(one, 1.0)
    beat.renew_once(now=time.monotonic() + 1.0)
    assert not any(one.lost for one in [lease, *held])
    assert cluster.master_of(slot) is to
    views = rl.inspect("moving")  # the map read again: straight to the new master
    assert [v.get("holder") for v in views] == [lease.owner] * 3, views
    for one in [lease, *held]:
        beat.drop(one)
        rl.release(one)
    assert redis_clusters3.keys("redlock:lock:*") == {0: [], 1: [], 2: []}


def test_a_cluster_none_of_whose_nodes_answers_is_a_node_down(redis_clusters3, free_port):
    dead = f"redis+cluster://127.0.0.1:{free_port},127.0.0.1:{free_port}"
    rl = Redlock([*redis_clusters3.urls[:2], dead], node_timeout=0.2)
    for i in range(3):
        lease = rl.acquire(f"dead-{i}", ttl=5)
        assert lease is not None  # the two other nodes carry the quorum
        views = rl.inspect(f"dead-{i}")
        assert [v.get("holder") for v in views[:2]] == [lease.owner] * 2
        assert "error" in views[2]  # not answering, never "free"
        rl.release(lease)
    assert redis_clusters3.keys("redlock:lock:*") == {0: [], 1: [], 2: []}
