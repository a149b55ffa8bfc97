"""Permits (``limit=K``) of the Redlock core on real redis-server nodes.

Safety: at most K holders at once, each permit granted on a quorum of one
index; tokens distinct and growing in grant order across the permits; a dead
holder's permit freed by task id whatever its index. Real workers are in
tests/integration/test_permits_live.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from celery_redlock.exceptions import ConfigurationError
from celery_redlock.redlock import Claim, Holder, Lease, TooEarly, make_owner
from tests.support.healthy import healthy

pytestmark = pytest.mark.integration

NAME = "export"


def keys_on(nodes, prefix: str = "redlock") -> set[str]:
    found: set[str] = set()
    for keys in nodes.keys().values():
        found |= {k for k in keys if not k.startswith(f"{prefix}:fence:")}
    return found


def test_limit_one_is_the_plain_lock_with_the_same_keys(nodes3):
    rl = healthy(nodes3.urls)
    lease = rl.acquire(NAME, ttl=5, limit=1)
    assert lease.key == rl.keys(NAME)[0] and lease.permit == 0
    assert rl.permit_keys(NAME, 1) == [rl.keys(NAME)[0]]
    assert rl.acquire(NAME, ttl=5, limit=1) is None
    rl.release(lease)


def test_k_permits_then_contention_then_a_freed_permit_is_taken_again(nodes3):
    rl = healthy(nodes3.urls)
    leases = [rl.acquire(NAME, ttl=5, limit=3) for _ in range(3)]
    assert all(isinstance(lease, Lease) for lease in leases)
    assert sorted(lease.permit for lease in leases) == [0, 1, 2]
    by_index = sorted(leases, key=lambda lease: lease.permit)
    assert [lease.key for lease in by_index] == rl.permit_keys(NAME, 3)
    tokens = [lease.fencing_token for lease in leases]
    assert tokens == sorted(set(tokens)), "tokens distinct and growing in grant order"
    blocked = rl.try_acquire(NAME, ttl=5, limit=3)
    assert isinstance(blocked, Holder) and blocked.owner in {lease.owner for lease in leases}
    assert rl.extend_many(leases) == [True, True, True]
    rl.release(leases[1])
    again = rl.acquire(NAME, ttl=5, limit=3)
    assert again.permit == leases[1].permit and again.fencing_token > max(tokens)
    for lease in (leases[0], leases[2], again):
        rl.release(lease)
    assert keys_on(nodes3) == set()


def test_a_copy_of_a_task_id_holding_a_permit_is_contention(nodes3):
    rl = healthy(nodes3.urls)
    first = rl.try_acquire(
        NAME, ttl=5, limit=3, owner=make_owner("t-1", 0), task_id="t-1", receipts=True
    )
    copy = rl.try_acquire(
        NAME, ttl=5, limit=3, owner=make_owner("t-1", 0), task_id="t-1", receipts=True
    )
    assert isinstance(first, Lease)
    assert isinstance(copy, Holder) and copy.task_id == "t-1"
    rl.release(first, receipt=60)
    done = rl.try_acquire(
        NAME, ttl=5, limit=3, owner=make_owner("t-1", 0), task_id="t-1", receipts=True
    )
    assert type(done).__name__ == "Finished"


def test_claims_and_throttle_work_with_permits(nodes3):
    rl = healthy(nodes3.urls)
    assert rl.claim_next(NAME, "t-9", ttl=30).claimant == "t-9"
    other = rl.try_acquire(NAME, ttl=5, limit=3, task_id="t-1", claim="check")
    assert isinstance(other, Claim) and other.claimant == "t-9"
    claimed = rl.try_acquire(NAME, ttl=5, limit=3, task_id="t-9", claim="take")
    assert isinstance(claimed, Lease)
    assert rl.claimant(NAME).claimant is None  # its run started: no claim pending
    rl.release(claimed)
    first = rl.try_acquire("throttled", ttl=5, limit=3, task_id="t-2", throttle=30)
    assert isinstance(first, Lease)
    early = rl.try_acquire("throttled", ttl=5, limit=3, task_id="t-3", throttle=30)
    assert isinstance(early, TooEarly) and 25 < early.wait <= 30
    rl.release(first)
    assert keys_on(nodes3) & set(rl.permit_keys("throttled", 3)) == set()


def test_release_owned_by_frees_a_permit_whatever_its_index(nodes3):
    rl = healthy(nodes3.urls)
    a = rl.acquire(NAME, ttl=30, limit=3, owner=make_owner("task-a", 0))
    b = rl.acquire(NAME, ttl=30, limit=3, owner=make_owner("task-b", 0))
    c = rl.acquire(NAME, ttl=30, limit=3, owner=make_owner("task-c", 0))
    assert (a.permit, b.permit, c.permit) == (0, 1, 2)
    assert rl.release_owned_by(NAME, "task-c", 3) == len(nodes3)  # one key on each node
    assert rl.release_owned_by(NAME, "task-c", 3) == 0
    d = rl.acquire(NAME, ttl=30, limit=3)
    assert d.permit == 2
    for lease in (a, b, d):
        rl.release(lease)
    assert keys_on(nodes3) == set()


def test_limit_must_be_a_whole_number_of_at_least_one(nodes3):
    rl = healthy(nodes3.urls)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigurationError, match="limit"):
            rl.try_acquire(NAME, ttl=5, limit=bad)


def test_fencing_off_grants_permits_without_tokens(nodes3):
    rl = healthy(nodes3.urls, fencing=False)
    leases = [rl.acquire(NAME, ttl=5, limit=2) for _ in range(2)]
    assert [lease.permit for lease in leases] == [0, 1]
    assert [lease.fencing_token for lease in leases] == [None, None]
    assert rl.acquire(NAME, ttl=5, limit=2) is None
    for lease in leases:
        rl.release(lease)


@pytest.mark.parametrize("nodes_fixture", ["redis_nodes3", "redis_nodes5", "redis_clusters3"])
def test_concurrent_holders_never_exceed_the_limit_and_tokens_stay_distinct(request, nodes_fixture):
    nodes = request.getfixturevalue(nodes_fixture)
    limit, threads_n, seconds = 3, 8, 2.0
    inside = 0
    peak = 0
    guard = threading.Lock()
    tokens: list[int] = []
    errors: list[BaseException] = []

    def loop():
        rl = healthy(nodes.urls)
        nonlocal inside, peak
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                lease = rl.acquire(
                    NAME,
                    ttl=5,
                    limit=limit,
                    blocking=True,
                    timeout=0.5,
                    retry_delay=0.002,
                    retry_delay_max=0.02,
                )
                if lease is None:
                    continue
                with guard:
                    inside += 1
                    peak = max(peak, inside)
                    tokens.append(lease.fencing_token)
                time.sleep(0.003)
                with guard:
                    inside -= 1
                rl.release(lease)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    print(f"{len(tokens)} permit grants, peak {peak} holders")  # shown with -s
    assert len(tokens) >= 30
    assert peak == limit, "the limit is used, and never exceeded"
    assert len(set(tokens)) == len(tokens), "tokens are distinct across permits"
    assert keys_on(nodes) == set()


# -- several names at once (also=) ----------------------------------------------------


def test_a_key_and_a_named_limit_are_taken_together_or_not_at_all(nodes3):
    rl = healthy(nodes3.urls)
    api = (("payment-api:{pay}", 2),)
    a = rl.acquire("order-1:{pay}", ttl=5, also=api)
    b = rl.acquire("order-2:{pay}", ttl=5, also=api)
    assert [x.permit for x in (a.also[0], b.also[0])] == [0, 1]
    assert a.also[0].key in rl.permit_keys("payment-api:{pay}", 2)
    # the key is free, the named limit is not: nothing is taken
    blocked = rl.try_acquire("order-3:{pay}", ttl=5, also=api)
    assert isinstance(blocked, Holder) and blocked.owner in (a.owner, b.owner)
    # the named limit has room, the key does not: nothing is taken
    rl.release(b)
    blocked = rl.try_acquire("order-1:{pay}", ttl=5, also=api)
    assert isinstance(blocked, Holder) and blocked.owner == a.owner
    assert rl.holder("order-3:{pay}").owner is None
    assert rl.extend(a) and not a.lost and not a.also[0].lost
    tokens = [a.fencing_token, a.also[0].fencing_token]
    assert all(isinstance(t, int) for t in tokens)
    c = rl.acquire("order-3:{pay}", ttl=5, also=api)
    assert c.also[0].permit == 1 and c.also[0].fencing_token > b.also[0].fencing_token
    rl.release(a)
    rl.release(c)
    assert keys_on(nodes3) == set()


def test_keys_and_a_named_limit_taken_together_never_deadlock(nodes3):
    """Threads each take one of 3 keys together with a limit of 2: both limits hold, and
    every thread keeps getting grants (no deadlock, no starvation of the round)."""
    inside: dict[str, int] = {}
    api_inside = peak_api = 0
    guard = threading.Lock()
    grants: list[str] = []
    errors: list[BaseException] = []

    def loop(i):
        nonlocal api_inside, peak_api
        rl = healthy(nodes3.urls)
        key = f"order-{i % 3}:{{pay}}"
        end = time.monotonic() + 2.0
        try:
            while time.monotonic() < end:
                lease = rl.acquire(
                    key,
                    ttl=5,
                    also=(("payment-api:{pay}", 2),),
                    blocking=True,
                    timeout=1.0,
                    retry_delay=0.002,
                    retry_delay_max=0.02,
                )
                if lease is None:
                    continue
                with guard:
                    inside[key] = inside.get(key, 0) + 1
                    api_inside += 1
                    peak_api = max(peak_api, api_inside)
                    assert inside[key] == 1, f"two holders of {key}"
                    grants.append(key)
                # held long enough for a grant on a node whose call is a commit of a
                # few ms (a ZooKeeper multi) to land inside: the peak is the point
                time.sleep(0.01)
                with guard:
                    inside[key] -= 1
                    api_inside -= 1
                rl.release(lease)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    print(f"{len(grants)} grants of a key with the named limit, peak {peak_api}")
    assert peak_api == 2
    assert {f"order-{i}:{{pay}}" for i in range(3)} <= set(grants)
    assert keys_on(nodes3) == set()


def test_names_across_slots_are_refused_together_on_a_cluster_node(redis_clusters3):
    rl = healthy(redis_clusters3.urls)
    with pytest.raises(ConfigurationError, match=r"also: .*different hash slots.*Redis Cluster"):
        rl.acquire("order-1", ttl=5, also=(("payment-api", 2),))
    assert keys_on(redis_clusters3) == set()  # refused before any round
