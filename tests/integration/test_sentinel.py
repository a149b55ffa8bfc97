"""Sentinel-managed nodes: a primary, a replica and three sentinels, started here on loopback.

Locking goes through the sentinels (``sentinel://`` URLs and Celery's own
Sentinel broker syntax), and on through a failover: the primary is SIGKILLed
mid-hold and the sentinels promote the replica. With ``min_replicas=1`` the
lock held across the failover is still its owner's afterwards; with 0 the
same schedule can hand it to a second owner (the documented limit).
"""

from __future__ import annotations

import time

import pytest
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.conf import nodes_from_app
from celery_redlock.exceptions import QuorumUnavailable
from celery_redlock.redlock import Holder, Lease, Redlock
from tests.support import deploy
from tests.support.harness import wait_for

pytestmark = pytest.mark.integration

#: Generous for a loaded machine; a round to a dead or moved master still ends
#: within a few of these, never hangs.
TIMEOUT = 0.2


@pytest.fixture
def sentinels():
    deployment = deploy.SentinelDeployment(replicas=1, sentinels=3)
    yield deployment
    deployment.close()


def test_the_lock_cycle_through_sentinels(sentinels):
    rl = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=1)
    (node,) = rl.nodes
    assert node.name == sentinels.url()
    lease = rl.acquire("job", ttl=10)
    assert isinstance(lease, Lease) and lease.fencing_token
    assert rl.holder("job").owner == lease.owner
    assert rl.extend(lease)
    for data in sentinels.data:  # on the primary, and confirmed on the replica
        with data.client() as client:
            assert client.get(lease.key) == lease.owner
    rl.release(lease)
    assert rl.acquire("job", ttl=10).fencing_token > lease.fencing_token


def test_the_same_sentinels_twice_is_one_node(sentinels):
    from celery_redlock.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="listed twice"):
        Redlock([sentinels.url(), sentinels.url(query="min_other_sentinels=1")])


def test_a_hung_sentinel_costs_a_timeout_never_a_hang(sentinels):
    sentinels.sentinels[0].pause()  # the first one asked: connects, never answers
    rl = Redlock([sentinels.url()], node_timeout=TIMEOUT)
    took, leases = [], []
    for i in range(3):
        start = time.monotonic()
        try:
            leases.append(rl.try_acquire(f"job-{i}", ttl=5))
        except QuorumUnavailable:
            pass
        took.append(time.monotonic() - start)
    # The sentinels are asked all at once: while the hung one says nothing,
    # another answers.
    assert max(took) < 2 * TIMEOUT + 0.3, took
    assert any(isinstance(lease, Lease) for lease in leases), leases
    sentinels.sentinels[0].resume()


def rounds_during(seconds: float, rl: Redlock) -> list[float]:
    """Try other names for ``seconds``: how long each round took (none may hang)."""
    took = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            result = rl.try_acquire(f"probe-{i}", ttl=5)
            if isinstance(result, Lease):
                rl.release(result)
        except QuorumUnavailable:
            pass
        took.append(time.monotonic() - start)
        i += 1
        time.sleep(0.02)
    return took


def test_a_replica_confirmed_lock_survives_the_failover(sentinels):
    owner = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=1)
    other = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=1)
    lease = owner.acquire("job", ttl=30)
    assert lease is not None
    old = sentinels.primary
    old.kill()  # SIGKILL mid-hold
    took = rounds_during(1.0, other)
    new = sentinels.wait_for_failover(old)
    took += rounds_during(0.3, other)  # the new master has no replica yet: refused, fast
    # The old primary comes back (empty); the sentinels make it the new master's replica.
    old.restart()
    wait_for(lambda: deploy.link_up(old), timeout=20, what="the old primary to resync")
    wait_for(lambda: deploy.confirms_writes(new), timeout=10, what="the new master's replica")
    # No round hung: each ended within the sentinels' and the node's timeouts.
    assert max(took) < 4 * TIMEOUT + 0.3, took
    # Locking goes on through the new master...
    fresh = other.acquire("after", ttl=10)
    assert isinstance(fresh, Lease)
    other.release(fresh)
    # ...and the lock held across the failover is still its owner's.
    seen = other.try_acquire("job", ttl=10)
    assert isinstance(seen, Holder) and seen.owner == lease.owner
    assert owner.extend(lease)
    with new.client() as client:
        assert client.get(lease.key) == lease.owner
    owner.release(lease)
    assert isinstance(other.acquire("job", ttl=10), Lease)


def test_a_demoted_master_sends_the_next_round_to_the_new_one(sentinels):
    """A failover that keeps the old master alive (SENTINEL FAILOVER): the
    connection to it fails, and the same round goes on to the new master."""
    owner = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=1)
    lease = owner.acquire("job", ttl=30)
    assert lease is not None
    new = sentinels.fail_over()
    assert owner.extend(lease)  # one call: no round is lost to the move
    other = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=1)
    seen = other.try_acquire("job", ttl=10)
    assert isinstance(seen, Holder) and seen.owner == lease.owner
    with new.client() as client:
        assert client.get(lease.key) == lease.owner


def test_a_readonly_reply_drops_the_connection(sentinels):
    """Should a demoted master keep our connection open, its READONLY answer
    drops it; the round goes on through a new connection to the master."""
    rl = Redlock([sentinels.url()], node_timeout=TIMEOUT)
    (node,) = rl.nodes
    lease = rl.acquire("job", ttl=10)
    replica = next(n for n in sentinels.data if n is not sentinels.primary)
    stale = node.pool.connection_class(**node.pool.connection_kwargs)
    stale.connect_to((replica.host, replica.port))  # as if the master had moved under it
    node.put_back(stale)
    assert rl.extend(lease)
    assert stale not in node._idle
    rl.release(lease)


def test_without_replica_confirmation_the_failover_can_hand_the_lock_to_a_second_owner(sentinels):
    """The documented limit of a bare primary, made deterministic: the grant
    never reaches the replica, then the primary dies and the replica is promoted."""
    confirmed = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=1)
    owner = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=0)
    other = Redlock([sentinels.url()], node_timeout=TIMEOUT, min_replicas=0)
    old = sentinels.primary
    (replica,) = [n for n in sentinels.data if n is not old]
    deploy.cut_replication(replica)
    # The same schedule with min_replicas=1: the grant is refused, not lost later.
    with pytest.raises(QuorumUnavailable, match="replicas confirmed"):
        confirmed.try_acquire("job", ttl=30)
    lease = owner.acquire("job", ttl=30)
    assert lease is not None  # granted by the primary alone
    old.kill()
    sentinels.wait_for_failover(old)
    second = wait_for(
        lambda: _lease_or_none(other, "job"), timeout=10, what="the new master to answer"
    )
    assert second.owner != lease.owner  # two owners of one lock
    assert not owner.extend(lease)  # the first learns it lost the lock at its next renewal
    # The fencing token still grows? Not here: the fence value was lost with the
    # primary, so the new one is seeded from the clock, which is larger.
    assert second.fencing_token > lease.fencing_token


def _lease_or_none(rl: Redlock, name: str) -> Lease | None:
    try:
        result = rl.try_acquire(name, ttl=30)
    except QuorumUnavailable:
        return None
    return result if isinstance(result, Lease) else None


# -- Celery: the broker's Sentinel URL as the default lock node -------------------------------


@pytest.fixture
def celery_config(sentinels):
    return {
        "broker_url": sentinels.celery_broker(),
        "broker_transport_options": {"master_name": sentinels.SERVICE},
        "result_backend": "cache+memory://",
        "redlock_node_timeout": TIMEOUT,
        "redlock_min_replicas": 1,
    }


@pytest.fixture
def sentinel_task(celery_app: Celery):
    @celery_app.task(base=LockedTask, bind=True, lock_on=("account",), name="sentinel.settle")
    def settle(self, account, fencing_token=None):
        self.request.redlock.check()
        return {"token": fencing_token, "key": self.request.redlock.key}

    return settle


def test_a_locked_task_locks_through_the_brokers_sentinels(
    sentinel_task, celery_app, celery_worker, sentinels
):
    (node,) = nodes_from_app(celery_app)
    assert node == sentinels.url()  # the broker's sentinels and master_name
    first = sentinel_task.delay("acct-1").get(timeout=30)
    second = sentinel_task.delay("acct-1").get(timeout=30)
    assert isinstance(first["token"], int) and second["token"] > first["token"]
    with sentinels.primary.client() as client:
        assert client.get(first["key"]) is None  # released
        assert client.exists(first["key"].replace(":lock:", ":fence:"))
