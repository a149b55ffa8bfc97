"""etcd lock nodes under the faults of their own kind, on a real three-member
cluster (one lock node): the leader killed while threads take turns, a
follower paused, a majority killed, the whole cluster restarted."""

from __future__ import annotations

import threading
import time

import pytest

from celery_redlock.core import Lease, Redlock
from celery_redlock.exceptions import QuorumUnavailable
from tests.support.section import Section

pytestmark = pytest.mark.integration

NAME = "pay"
TTL_FLOOR = 2  # etcd's shortest lease, in seconds


def _url(cluster, first: int) -> str:
    """The cluster's URL with member ``first`` tried first."""
    order = [first] + [i for i in range(len(cluster)) if i != first]
    return "etcd://" + ",".join(cluster[i].endpoint for i in order)


def _once_answered(rl: Redlock, name: str):
    """``try_acquire`` (a Lease, or the Holder) once the cluster answers again (its
    members electing a leader)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return rl.try_acquire(name, ttl=5)
        except QuorumUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_the_leader_killed_during_a_threaded_run(etcd_cluster3):
    """SIGKILL on the leader while four threads take one name: no two holders,
    tokens strictly growing in grant order, grants resume within seconds, and a
    lease held across the leader change stays held."""
    rl = Redlock([etcd_cluster3.url], node_timeout=1.0)
    kept = rl.acquire("kept", ttl=30)
    assert kept is not None
    stop = threading.Event()
    section = Section()

    def take() -> None:
        while not stop.is_set():
            try:
                lease = rl.acquire(NAME, ttl=TTL_FLOOR, blocking=True, timeout=1)
            except QuorumUnavailable:
                continue
            if lease is None:
                continue
            with section.held(lease.fencing_token):
                pass
            rl.release(lease)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    failsafe = time.monotonic() + 90  # a hang, not a slow host: the run ends on the counts
    killed_at = None
    try:
        while len(section.grants) < 30 and time.monotonic() < failsafe:
            time.sleep(0.01)
        leader = etcd_cluster3.leader()
        killed_at = time.monotonic()
        etcd_cluster3.kill(leader)
        before = len(section.grants)
        while len(section.grants) < before + 30 and time.monotonic() < failsafe:
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    grants, times = section.grants, section.times
    assert len(grants) >= 60
    assert section.overlaps == 0
    assert grants == sorted(set(grants))  # strictly growing, in the order granted
    resumed = min(t for t in times if t > killed_at + 0.05) - killed_at
    # the worst case: a release lost with the leader leaves the name held, and the new
    # leader renews every lease to its full TTL; add the election (1 s) and the call
    # that timed out on the dead leader, then a loaded host's 3x
    assert resumed < 3 * (TTL_FLOOR + 1.0 + rl.node_timeout), resumed
    assert rl.holder("kept").owner == kept.owner
    assert rl.acquire("kept", ttl=5) is None
    rl.release(kept)


def test_a_paused_follower_first_in_the_url_does_not_stop_a_call(etcd_cluster3):
    leader = etcd_cluster3.leader()
    follower = next(i for i in range(3) if i != leader)
    rl = Redlock([_url(etcd_cluster3, follower)], node_timeout=2.0)
    rl.release(rl.acquire("warm", ttl=5))
    etcd_cluster3.pause(follower)
    began = time.monotonic()
    lease = rl.try_acquire(NAME, ttl=5)  # one round: half its time on the paused member
    assert lease is not None
    assert time.monotonic() - began < 2.0 + 1.5
    assert rl.acquire(NAME, ttl=5) is None
    rl.release(lease)
    etcd_cluster3.resume(follower)


def test_a_majority_killed_is_quorum_unavailable_in_about_one_node_timeout(etcd_cluster3):
    rl = Redlock([etcd_cluster3.url], node_timeout=1.0)
    held = rl.acquire(NAME, ttl=30)
    assert held is not None
    leader = etcd_cluster3.leader()
    etcd_cluster3.kill(leader)
    etcd_cluster3.kill(next(i for i in range(3) if i != leader))
    began = time.monotonic()
    with pytest.raises(QuorumUnavailable):
        rl.try_acquire(NAME, ttl=5)  # never "free": the survivor has no quorum
    took = time.monotonic() - began
    assert took < 1.0 + 1.5, took  # one node timeout, with a loaded host's slack
    with pytest.raises(QuorumUnavailable):
        rl.try_acquire("another", ttl=5)
    etcd_cluster3.start()
    still = _once_answered(rl, NAME)
    assert not isinstance(still, Lease) and still.owner == held.owner  # still held
    rl.release(held)


def test_a_whole_cluster_restarted_keeps_held_leases_and_tokens_grow(etcd_cluster3):
    rl = Redlock([etcd_cluster3.url], node_timeout=1.0)
    first = rl.acquire(NAME, ttl=5)
    assert first is not None
    rl.release(first)
    held = rl.acquire("kept", ttl=30)
    assert held is not None
    for i in range(3):
        etcd_cluster3.kill(i)
    etcd_cluster3.start()
    again = _once_answered(rl, NAME)
    assert isinstance(again, Lease) and again.fencing_token > first.fencing_token
    assert rl.acquire("kept", ttl=5) is None
    assert rl.holder("kept").owner == held.owner
    rl.release(again)
    rl.release(held)
