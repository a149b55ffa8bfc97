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


def hold(node, key: str, owner: str) -> None:
    with node.client() as client:
        client.set(key, owner, px=30_000)


def let_go(nodes, key: str) -> None:
    for node in nodes:
        with node.client() as client:
            client.delete(key)


def test_a_split_is_tried_again_and_won_once_the_contenders_let_go(redis_nodes3):
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # meanwhile, the other two contenders let go
        pauses.append(seconds)
        let_go(redis_nodes3, key)

    rl = healthy(redis_nodes3.urls, sleep=pause)
    key = rl.keys(NAME)[0]
    hold(redis_nodes3[0], key, "x|0|other|1")
    hold(redis_nodes3[1], key, "y|0|other|2")
    lease = rl.try_acquire(NAME, ttl=10)
    assert isinstance(lease, Lease), lease
    assert len(pauses) == 1 and 0 <= pauses[0] <= rl.node_timeout
    rl.release(lease)


def test_a_split_that_lasts_is_reported_after_the_retries(redis_nodes3):
    pauses: list[float] = []
    rl = healthy(redis_nodes3.urls, sleep=pauses.append)
    key = rl.keys(NAME)[0]
    hold(redis_nodes3[0], key, "x|0|other|1")
    hold(redis_nodes3[1], key, "y|0|other|2")
    try:
        held = rl.try_acquire(NAME, ttl=10)
        assert isinstance(held, Holder) and held.owner in ("x|0|other|1", "y|0|other|2")
        assert len(pauses) == SPLIT_RETRIES
        with redis_nodes3[2].client() as client:  # each attempt let its node go
            assert client.exists(key) == 0
    finally:
        let_go(redis_nodes3, key)


def test_a_holder_on_a_quorum_is_reported_at_once(redis_nodes3):
    pauses: list[float] = []
    rl = healthy(redis_nodes3.urls, sleep=pauses.append)
    key = rl.keys(NAME)[0]
    hold(redis_nodes3[0], key, "x|0|other|1")
    hold(redis_nodes3[1], key, "x|0|other|1")
    try:
        held = rl.try_acquire(NAME, ttl=10)
        assert isinstance(held, Holder) and held.owner == "x|0|other|1"
        assert pauses == []  # a real holder: no second attempt
    finally:
        let_go(redis_nodes3, key)


def test_a_gated_attempt_is_not_tried_again(redis_nodes3):
    """Claims, receipts and throttles keep their one round: the callers that use them
    decide themselves what a contended start means."""
    pauses: list[float] = []
    rl = healthy(redis_nodes3.urls, sleep=pauses.append)
    key = rl.keys(NAME)[0]
    hold(redis_nodes3[0], key, "x|0|other|1")
    hold(redis_nodes3[1], key, "y|0|other|2")
    try:
        held = rl.try_acquire(NAME, ttl=10, task_id="t1", receipts=True)
        assert isinstance(held, Holder) and pauses == []
    finally:
        let_go(redis_nodes3, key)
