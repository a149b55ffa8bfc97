"""Replica-confirmed grants (``min_replicas``) on a real primary with a real replica."""

from __future__ import annotations

import time

import pytest

from celery_redlock.exceptions import QuorumUnavailable
from celery_redlock.redlock import Lease, Redlock
from tests.support.deploy import primary_with_replicas

pytestmark = pytest.mark.integration

# WAIT that falls short is answered at the server's next cron tick (100 ms at
# the default hz 10): a round with a silent replica takes this long, no longer.
TIMEOUT = 0.2


@pytest.fixture
def pair():
    nodes = primary_with_replicas(1)
    yield nodes
    for node in nodes:
        node.close()


def test_a_grant_renewal_and_release_with_a_confirming_replica(pair):
    primary, replica = pair
    rl = Redlock([primary.url], node_timeout=TIMEOUT, min_replicas=1)
    lease = rl.acquire("job", ttl=5)
    assert isinstance(lease, Lease) and lease.fencing_token
    # Confirmed: the replica holds the key when the grant returns, not later.
    with replica.client() as client:
        assert client.get(lease.key) == lease.owner
    assert rl.extend(lease, 8)
    with replica.client() as client:
        assert client.pttl(lease.key) > 5000
    rl.release(lease)
    assert rl.acquire("job", ttl=5) is not None


def test_a_silent_replica_makes_the_node_not_count(pair):
    primary, replica = pair
    rl = Redlock([primary.url], node_timeout=TIMEOUT, min_replicas=1)
    held = rl.acquire("held", ttl=5)
    assert held is not None
    replica.pause()
    start = time.monotonic()
    with pytest.raises(QuorumUnavailable) as info:
        rl.try_acquire("job", ttl=5)
    assert time.monotonic() - start < 3 * (TIMEOUT + 1.0)  # bounded by the round, never a hang
    assert primary.url in str(info.value) or "127.0.0.1" in str(info.value)
    assert "replicas confirmed" in str(info.value) or "Timeout" in str(info.value)
    # The unconfirmed grant was withdrawn from the primary.
    with primary.client() as client:
        assert client.get(rl.keys("job")[0]) is None
    # A renewal its replica does not confirm loses the lease.
    assert not rl.extend(held)
    assert held.lost
    replica.resume()


def test_claims_are_confirmed_like_grants(pair):
    primary, replica = pair
    # A round long enough for the primary to answer the WAIT's shortfall (at half
    # the round, noticed at its next 100 ms tick): a primary that does not answer
    # keeps an enqueue claim (its claimant is published all the same), and this
    # test is about the primary saying its replica did not confirm.
    rl = Redlock([primary.url], node_timeout=1.0, min_replicas=1)
    assert rl.claim("slot:1", "beat-a", ttl=60) is True
    assert rl.claim_next("job", "task-1", ttl=60).claimant == "task-1"
    with replica.client() as client:  # on the replica when the call returns
        assert client.get("redlock:slot:1") == "beat-a"
        assert client.get(rl.claim_key("job")) == "task-1"
    replica.pause()
    try:
        with pytest.raises(QuorumUnavailable, match="replicas confirmed"):
            rl.claim("slot:2", "beat-a", ttl=60)
        with pytest.raises(QuorumUnavailable, match="replicas confirmed"):
            rl.claim_next("other", "task-2", ttl=60)
        with primary.client() as client:  # the unconfirmed claims were withdrawn
            assert client.get("redlock:slot:2") is None
            assert client.get(rl.claim_key("other")) is None
    finally:
        replica.resume()


def test_rate_bookings_are_confirmed_like_grants(pair):
    primary, replica = pair
    rl = Redlock([primary.url], node_timeout=TIMEOUT, min_replicas=1)
    assert rl.rate("api", "10/s").now
    key = rl.coalesce_key("api", "rate")
    with replica.client() as client:  # on the replica when the call returns
        booked = client.hget(key, "10/1000")
    assert booked is not None
    replica.pause()
    try:
        with pytest.raises(QuorumUnavailable, match="replicas confirmed|Timeout"):
            rl.rate("api", "10/s")
        with primary.client() as client:  # the unconfirmed booking was taken back
            assert client.hget(key, "10/1000") == booked
    finally:
        replica.resume()
    assert rl.rate("api", "10/s").wait <= 0.1 + 0.01  # the next slot after the first


def test_without_min_replicas_a_silent_replica_changes_nothing(pair):
    primary, replica = pair
    rl = Redlock([primary.url], node_timeout=TIMEOUT)
    replica.pause()
    lease = rl.acquire("job", ttl=5)
    assert lease is not None and rl.extend(lease)
    rl.release(lease)
    replica.resume()


def test_min_replicas_adds_wait_only_to_writes_a_lease_or_claim_rests_on(pair, monkeypatch):
    from celery_redlock.core.nodes.redis import rounds

    sent = []
    real = rounds.gather_each  # every masters' round goes through it

    def spy(nodes, commands, *rest, **options):
        parts = commands[0].parts  # the command, then WAIT where it is asked
        sent.append((parts[0][0], parts[1][0] if len(parts) > 1 else None))
        return real(nodes, commands, *rest, **options)

    primary, _ = pair
    rl = Redlock([primary.url], node_timeout=TIMEOUT, min_replicas=1)

    def cycle():
        lease = rl.acquire("job", ttl=5)
        rl.extend(lease)
        rl.holder("job")
        rl.release(lease)
        rl.claim_next("job", "task-1", ttl=5)
        rl.withdraw_claim("job", "task-1")

    cycle()  # the scripts are loaded: every round below is one EVALSHA
    monkeypatch.setattr(rounds, "gather_each", spy)
    cycle()
    assert [then for _, then in sent] == ["WAIT", "WAIT", None, None, "WAIT", None]
    sent.clear()
    plain = Redlock([primary.url], node_timeout=TIMEOUT)
    plain.release(plain.acquire("job", ttl=5))
    assert [then for _, then in sent] == [None, None]
