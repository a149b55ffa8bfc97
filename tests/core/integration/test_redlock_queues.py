"""A queue's hand-over in the Redlock core, where the nodes' queues differ, on real nodes."""

from __future__ import annotations

import warnings

import pytest

from tests.support.healthy import healthy, healthy_under
from tests.support.kinds import needs_three

pytestmark = pytest.mark.integration

NAME = "report:{queue}"


@pytest.fixture
def rl(nodes3):
    yield from healthy_under(nodes3, "crl-queues")


def test_a_stale_claim_on_one_node_beside_one_restarted_empty_still_hands_over(rl, nodes3):
    """Node 0 lacks the calls parked before it restarted empty; node 1 still holds the
    pending claim of a call that started (its take missed node 1, the drop did not).
    Node 1 ignores that claim (its id no longer waits there), so nodes 1 and 2 agree
    on the first call waiting: the queue moves on instead of waiting out the claim."""
    needs_three(nodes3)
    with warnings.catch_warnings():  # two nodes: parked before node 0 restarted
        warnings.simplefilter("ignore", RuntimeWarning)
        rest = healthy(nodes3.urls[1:], key_prefix="crl-queues")
    for call in ("b", "c"):
        assert rest.park(NAME, call, f"call-{call}", most=0, retention=60).parked
    assert rl.park(NAME, "d", "call-d", most=0, retention=60).parked  # after it: everywhere
    with nodes3[1].client() as c:
        c.set(rl.claim_key(NAME), "a", px=60_000)  # "a" started; its claim stayed here
    handed = rl.queue_next(NAME, limit=1, claim_ttl=30, retention=60)
    assert (handed.id, handed.call, handed.state) == ("b", "call-b", "handed")
    # a claim of a call still waiting is pending: nothing is handed over it
    assert rl.queue_next(NAME, limit=1, claim_ttl=30, retention=60).state == "pending"
