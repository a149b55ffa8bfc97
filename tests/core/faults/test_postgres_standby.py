"""A PostgreSQL lock node with a real synchronous standby: ``min_replicas``
makes a grant count only once the standby has applied it, so a promoted
standby holds every grant; a server with no synchronous standby is refused.

The standby replays ``APPLY_DELAY`` behind (``recovery_min_apply_delay``), which
tells "applied" (``remote_apply``) from the server's default "flushed": the
first waits for the delay, the second does not."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from celery_redlock.core import Redlock
from celery_redlock.exceptions import QuorumUnavailable
from celery_redlock.testing.postgres import PostgresServer

pytestmark = pytest.mark.integration

APPLY_DELAY = 2.0


@pytest.fixture(scope="module")
def pair(postgres_servers_session) -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A primary whose commits wait for a synchronous standby, and that standby.
    (``postgres_servers_session`` skips, or fails under ``CI=true``, where no
    server can be started.)"""
    primary = PostgresServer(settings={"synchronous_standby_names": "*"})
    try:
        standby = PostgresServer(
            standby_of=primary,
            settings={"recovery_min_apply_delay": f"{int(APPLY_DELAY * 1000)}ms"},
        )
    except BaseException:
        primary.close()
        raise
    try:
        yield primary, standby
    finally:
        standby.close()
        primary.close()


def lock_keys(server: PostgresServer, name: str) -> list[str]:
    return server.keys(f"%:lock:{{{name}}}")


def test_a_grant_counts_once_the_standby_has_applied_it(pair):
    primary, standby = pair
    confirmed = Redlock([primary.url], node_timeout=APPLY_DELAY * 10, min_replicas=1)
    began = time.monotonic()
    lease = confirmed.acquire("pay", ttl=60)
    took = time.monotonic() - began
    assert lease is not None
    # the grant came back only after the standby applied it: it is readable there now
    assert took >= APPLY_DELAY * 0.9
    assert lock_keys(standby, "pay")

    flushed = Redlock([primary.url], node_timeout=APPLY_DELAY * 10)
    began = time.monotonic()
    other = flushed.acquire("ship", ttl=60)
    took = time.monotonic() - began
    assert other is not None
    # without min_replicas the commit waits for the standby's flush only: the
    # grant stands on the primary, and the standby has not applied it yet
    assert took < APPLY_DELAY
    assert lock_keys(primary, "ship") and not lock_keys(standby, "ship")


def test_a_standby_that_does_not_confirm_in_time_is_no_grant(pair):
    """A node timeout shorter than the standby's apply: the round ends as "not
    answering" in about the timeout, never as a grant, and never hangs."""
    primary, _ = pair
    impatient = Redlock([primary.url], node_timeout=0.5, min_replicas=1)
    began = time.monotonic()
    with pytest.raises(QuorumUnavailable):
        impatient.try_acquire("refund", ttl=60)
    # one round of 0.5 s (plus a loaded host's slack), far short of a hang
    assert time.monotonic() - began < APPLY_DELAY * 3


def test_min_replicas_is_refused_where_no_standby_is_synchronous(postgres_node1):
    """The node answers every call with the reason, as for a missing schema:
    the round names it, and nothing is granted."""
    rl = Redlock(postgres_node1.urls, node_timeout=2, min_replicas=1)
    with pytest.raises(QuorumUnavailable, match="needs a synchronous standby"):
        rl.try_acquire("pay", ttl=5)
    assert not postgres_node1[0].keys()
