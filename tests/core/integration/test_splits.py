"""Contenders that split the nodes: nobody holds a quorum, so the attempt is made again.

Three copies of a task that start at the same instant can each win one node of
three: each then lets go. Reported as "held by another", that split would have
every copy drop its work while none runs; the attempt is made again after a
random pause instead (``SPLIT_RETRIES`` times at most). The contenders here are
keys written straight onto the nodes, so every step is under the test's control.
"""

from __future__ import annotations

import pytest

from celery_redlock.core.lease import SPLIT_RETRIES
from celery_redlock.redlock import Holder, Lease
from tests.support.healthy import healthy

pytestmark = pytest.mark.integration

NAME = "split"


X, Y = "x|0|other|1", "y|0|other|2"


def hold(nodes, key: str, *owners: str) -> None:
    """The contenders' keys: ``owners[i]`` on node i."""
    for node, owner in zip(nodes, owners):
        with node.client() as client:
            client.set(key, owner, px=30_000)


def let_go(nodes, key: str) -> None:
    for node in nodes:
        with node.client() as client:
            client.delete(key)


@pytest.fixture
def pauses() -> list[float]:
    return []


@pytest.fixture
def rl(redis_nodes3, pauses):
    return healthy(redis_nodes3.urls, sleep=pauses.append)


@pytest.fixture
def key(rl, redis_nodes3):
    key = rl.keys(NAME)[0]
    yield key
    let_go(redis_nodes3, key)


def test_a_split_is_tried_again_and_won_once_the_contenders_let_go(redis_nodes3, key, pauses):
    def pause(seconds: float) -> None:  # meanwhile, the other two contenders let go
        pauses.append(seconds)
        let_go(redis_nodes3, key)

    rl = healthy(redis_nodes3.urls, sleep=pause)
    hold(redis_nodes3, key, X, Y)
    lease = rl.try_acquire(NAME, ttl=10)
    assert isinstance(lease, Lease), lease
    assert len(pauses) == 1 and 0 <= pauses[0] <= rl.node_timeout
    rl.release(lease)


def test_a_split_that_lasts_is_reported_after_the_retries(redis_nodes3, rl, key, pauses):
    hold(redis_nodes3, key, X, Y)
    held = rl.try_acquire(NAME, ttl=10)
    assert isinstance(held, Holder) and held.owner in (X, Y)
    assert len(pauses) == SPLIT_RETRIES
    with redis_nodes3[2].client() as client:  # each attempt let its node go
        assert client.exists(key) == 0


def test_a_holder_on_a_quorum_is_reported_at_once(redis_nodes3, rl, key, pauses):
    hold(redis_nodes3, key, X, X)
    held = rl.try_acquire(NAME, ttl=10)
    assert isinstance(held, Holder) and held.owner == X
    assert pauses == []  # a real holder: no second attempt


def test_a_gated_attempt_is_not_tried_again(redis_nodes3, rl, key, pauses):
    """Claims, receipts and throttles keep their one round: the callers that use them
    decide themselves what a contended start means."""
    hold(redis_nodes3, key, X, Y)
    held = rl.try_acquire(NAME, ttl=10, task_id="t1", receipts=True)
    assert isinstance(held, Holder) and pauses == []
