"""The heartbeat's real thread against real redis-server nodes."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from celery_redlock.core import heartbeat
from celery_redlock.core.heartbeat import THREAD_NAME, Heartbeat
from celery_redlock.exceptions import LockLost
from celery_redlock.redlock import Redlock
from tests.support.kinds import params

pytestmark = pytest.mark.integration

TTL = 1.0
INTERVAL = 0.3
#: Generous, so that a loaded test machine is not mistaken for a node outage.
NODE_TIMEOUT = 0.5


def test_the_thread_keeps_a_short_lease_alive_until_dropped(redis_nodes3, default_heartbeat):
    redlock = Redlock(redis_nodes3.urls, node_timeout=NODE_TIMEOUT)
    lease = redlock.acquire("hb-alive", ttl=TTL)
    assert lease is not None
    lost = []
    heartbeat.hold(lease, INTERVAL, on_lost=lost.append)

    end = time.monotonic() + 3 * TTL  # three TTLs: it would have expired without renewals
    while time.monotonic() < end:
        time.sleep(0.1)
        assert not lease.lost, lease
    assert redlock.holder("hb-alive").owner == lease.owner
    assert lease.remaining() > 0 and lost == []
    for node in redis_nodes3:
        with node.client() as client:
            assert client.pttl(lease.key) > 0

    heartbeat.drop(lease)
    dropped = time.monotonic()
    assert heartbeat.held() == []
    while redlock.holder("hb-alive").owner is not None:
        assert time.monotonic() - dropped < TTL + 0.5, "the lease outlived its TTL after drop"
        time.sleep(0.02)
    assert lost == []  # a dropped lease is not reported lost when it expires


def test_a_majority_of_nodes_down_loses_the_lease(redis_node_factory, default_heartbeat, caplog):
    nodes = redis_node_factory(3)
    redlock = Redlock(nodes.urls, node_timeout=NODE_TIMEOUT)
    lease = redlock.acquire("hb-majority", ttl=TTL)
    assert lease is not None
    fired = threading.Event()
    calls = []

    def on_lost(lost_lease):
        calls.append((lost_lease, threading.current_thread().name))
        fired.set()

    heartbeat.hold(lease, INTERVAL, on_lost=on_lost)
    time.sleep(INTERVAL + 0.1)  # at least one renewal on all three nodes
    assert not lease.lost

    with caplog.at_level(logging.WARNING, logger="celery_redlock.heartbeat"):
        nodes.kill(0)
        nodes.kill(1)
        killed = time.monotonic()
        assert fired.wait(10), "on_lost did not fire"
        elapsed = time.monotonic() - killed
        time.sleep(2 * INTERVAL)  # and it fires once

    # found by the renewal that failed (the message names the quorum), not once the
    # lease lapsed; 3x slack on the interval plus the TTL
    assert elapsed < 3 * (INTERVAL + TTL)
    assert calls == [(lease, THREAD_NAME)]
    assert lease.lost and heartbeat.held() == []
    with pytest.raises(LockLost):
        lease.check()
    messages = [r.getMessage() for r in caplog.records if r.name == "celery_redlock.heartbeat"]
    assert len(messages) == 1 and repr(lease.key) in messages[0] and "quorum" in messages[0]


@pytest.fixture(**params(lambda s: s.kind == "redis" and s.count == 3))
def redis_nodes(request):
    """Nodes whose command counts the test reads (``INFO commandstats``)."""
    return request.getfixturevalue(request.param)


def test_a_round_sends_one_script_call_per_node_whatever_the_number_of_leases(redis_nodes):
    nodes3 = redis_nodes
    """On plain masters, one call per node; on clusters, one call per shard
    master, each renewing the leases of all its slots."""
    beat = Heartbeat(autostart=False)
    redlock = Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT)
    leases = [redlock.acquire(f"hb-batch-{i}", ttl=10.0) for i in range(1000)]
    for lease in leases:
        beat.hold(lease, 1.0)
    beat.renew_once(now=time.monotonic() + 1.0)  # loads the script on the nodes
    # the servers that run scripts: each node, or each shard master of a cluster
    servers = [[*getattr(node, "masters", [node])] for node in nodes3]
    for server in (s for group in servers for s in group):
        with server.client() as client:
            client.config_resetstat()

    beat.renew_once(now=time.monotonic() + 2.0)

    for group in servers:
        renewed = 0
        for server in group:
            with server.client() as client:
                stats = client.info("commandstats")
            assert stats["cmdstat_evalsha"]["calls"] == 1, stats
            assert "cmdstat_eval" not in stats
            assert stats["cmdstat_pexpire"]["calls"] > 0  # the leases are spread over every shard
            renewed += stats["cmdstat_pexpire"]["calls"]  # run by the script, not sent one by one
        assert renewed == 1000
    assert beat.held() == leases and not any(lease.lost for lease in leases)
