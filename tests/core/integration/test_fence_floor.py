"""Every grant's fence value is at least the node's clock, on real nodes of each kind.

A fence value outlives a change of the node list (its retention is 7 days), a
database is restored apart from the data it guards, a client's clock is set
back: the tokens handed out after any of them are still larger than those
handed out before, because each grant takes max(the value moved on, the
node's clock, the client's clock a second on). The resource below keeps the
largest token it accepted, as the fencing page's ``UPDATE ... WHERE fence <
:token`` does, and must accept every grant.
"""

from __future__ import annotations

import time
import types

import pytest

from celery_redlock.core import fencing, lease, permits
from celery_redlock.core.nodes.postgres.schema import REVISION, VERSION
from celery_redlock.exceptions import QuorumUnavailable
from celery_redlock.redlock import Redlock
from tests.support.fencing_history import assert_strictly_increasing
from tests.support.healthy import healthy

pytestmark = pytest.mark.integration

NAME = "payouts"
WEEK = 7 * 24 * 3600
RETENTION = WEEK  # redlock_fence_retention's default


class Resource:
    """A fenced resource: refuses a token not above the largest it accepted."""

    def __init__(self) -> None:
        self.fence = 0
        self.refused: list[int] = []

    def write(self, token: int) -> None:
        if token > self.fence:
            self.fence = token
        else:
            self.refused.append(token)


def run(urls, resource: Resource, grants: int = 5, limit: int = 1) -> list[int]:
    """``grants`` grants of NAME on the nodes at ``urls``, each writing the resource."""
    rl = healthy(urls, fence_retention=RETENTION)
    tokens = []
    try:
        for i in range(grants):
            held = rl.acquire(NAME, ttl=10, limit=limit, fence=i % 2 == 0)  # eager, lazy...
            tokens.append(held.fencing_token)
            resource.write(held.fencing_token)
            rl.release(held)
    finally:
        rl.close()
    return tokens


def node_clock_us(nodes) -> int:
    """The latest of the nodes' clocks now, in microseconds (TIME on each)."""
    latest = 0
    for node in nodes:
        with node.client() as client:
            seconds, micros = client.time()
        latest = max(latest, seconds * 1_000_000 + micros)
    return latest


def test_tokens_grow_from_postgres_to_etcd_and_back(postgres_node1, etcd_node1):
    """The team's week: PostgreSQL, then etcd, then PostgreSQL again, whose fence row
    still holds the first run's values (within the retention)."""
    resource = Resource()
    tokens = run(postgres_node1.urls, resource)
    tokens += run(etcd_node1.urls, resource)
    with postgres_node1[0].client() as client:
        assert client.get(healthy(postgres_node1.urls).keys(NAME)[1]) == str(tokens[4])  # kept
    tokens += run(postgres_node1.urls, resource)
    tokens += run(postgres_node1.urls, resource, limit=2)  # permits share the fence value
    assert_strictly_increasing(tokens)
    assert resource.refused == []


def test_tokens_grow_from_one_redis_node_set_to_another_and_back(redis_nodes3, redis_node_factory):
    other = redis_node_factory(3)
    resource = Resource()
    tokens = run(redis_nodes3.urls, resource)
    tokens += run(other.urls, resource)
    tokens += run(redis_nodes3.urls, resource)  # its fence values are the first run's
    tokens += run(other.urls, resource, limit=2)
    assert_strictly_increasing(tokens)
    assert resource.refused == []


@pytest.fixture
def client_a_week_behind(monkeypatch):
    """The client's clock a week behind (the clock the acquire sends), the nodes' right."""
    behind = types.SimpleNamespace(time_ns=lambda: time.time_ns() - WEEK * 10**9)
    for module in (lease, permits, fencing):
        monkeypatch.setattr(module, "time", behind)


@pytest.mark.parametrize(
    "nodes_fixture", ["redis_nodes3", "postgres_nodes3", "postgres_node1", "etcd_node1"]
)
@pytest.mark.parametrize("how", ["eager", "lazy", "permit"])
def test_a_restored_fence_a_week_old_gives_a_token_above_the_node_clock(
    request, nodes_fixture, how, client_a_week_behind
):
    nodes = request.getfixturevalue(nodes_fixture)
    # 5 s: a PostgreSQL permit round beside two busy cores once took over the 2 s of healthy()
    rl = healthy(nodes.urls, fence_retention=RETENTION, node_timeout=5.0)
    rl.release(rl.acquire(NAME, ttl=10))  # in use until the restore
    _, fence_key = rl.keys(NAME)
    week_old = str(time.time_ns() // 1000 - WEEK * 10**6)
    for node in nodes:  # what a restore of last week's lock database leaves
        with node.client() as client:
            client.set(fence_key, week_old, px=RETENTION * 1000)
    clock = node_clock_us(nodes)
    held = rl.acquire(NAME, ttl=10, fence=how != "lazy", limit=2 if how == "permit" else 1)
    token = held.fencing_token  # a lazy lease's: issued now (on Redis, after a bare SET NX)
    assert token > clock > int(week_old)
    rl.release(held)
    after = rl.acquire(NAME, ttl=10)
    assert after.fencing_token > token
    rl.release(after)


# -- PostgreSQL: the functions of an earlier revision, and the release that made them --

# What the release before revision 1 reads of a node: the version alone.
PREVIOUS_CHECK = "SELECT max(version) FROM redlock.meta"


def as_previous_release_left_it(server) -> None:
    """The schema as the release before revision 1 made it: no revision column, and
    grants that move the fence value on by one, with no clock (a floor of 0)."""
    server.sql("ALTER TABLE redlock.meta DROP COLUMN revision")
    server.sql(f"DELETE FROM redlock.meta; INSERT INTO redlock.meta (version) VALUES ({VERSION})")
    server.sql(
        "CREATE OR REPLACE FUNCTION redlock.fence_floor(now_us text) RETURNS numeric "
        "LANGUAGE sql AS $$ SELECT 0::numeric $$"
    )


def fresh(urls) -> Redlock:
    """A client as a new process makes it: its nodes' schema not checked yet."""
    rl = healthy(urls, fence_retention=RETENTION)
    for node in rl.nodes:
        node._checked = False
    return rl


def test_a_node_of_an_earlier_revision_is_brought_up_to_date_in_place(postgres_node1):
    server = postgres_node1[0]
    running = fresh(postgres_node1.urls)  # a process already at work on the node
    running.release(running.acquire(NAME, ttl=10))
    as_previous_release_left_it(server)
    _, fence_key = running.keys(NAME)
    week_old = (time.time_ns() // 1000) - WEEK * 10**6
    with server.client() as client:
        client.set(fence_key, str(week_old), px=RETENTION * 1000)
    # the bodies a node holds are what every process on it runs: moved on by one
    old = running.acquire(NAME, ttl=10)
    assert old.fencing_token == week_old + 1
    running.release(old)
    assert server.sql(PREVIOUS_CHECK) == [(VERSION,)]

    clock = node_clock_us(postgres_node1)
    new = fresh(postgres_node1.urls)  # the first new process brings the functions up
    lease_ = new.acquire(NAME, ttl=10)
    assert lease_.fencing_token > clock
    new.release(lease_)
    assert server.sql("SELECT version, revision FROM redlock.meta") == [(VERSION, REVISION)]
    assert server.sql(PREVIOUS_CHECK) == [(VERSION,)]  # the previous release still runs here
    # and the process that was already running shares the one sequence, and the lock
    shared = running.acquire(NAME, ttl=10)
    assert shared.fencing_token > lease_.fencing_token
    assert new.acquire(NAME, ttl=10) is None
    running.release(shared)

    # a revision ahead (a newer release's bodies of this version) is used as it is
    server.sql("UPDATE redlock.meta SET revision = revision + 1")
    ahead = fresh(postgres_node1.urls)
    ahead.release(ahead.acquire(NAME, ttl=10))
    assert server.sql("SELECT revision FROM redlock.meta") == [(REVISION + 1,)]
    server.sql("UPDATE redlock.meta SET revision = %s", REVISION)


def test_a_role_that_may_not_update_the_functions_is_told_what_to_run(postgres_node1):
    server = postgres_node1[0]
    as_previous_release_left_it(server)
    server.sql("DROP ROLE IF EXISTS crl_app")
    server.sql("CREATE ROLE crl_app LOGIN")
    server.sql("GRANT USAGE ON SCHEMA redlock TO crl_app")
    server.sql("GRANT ALL ON ALL TABLES IN SCHEMA redlock TO crl_app")
    try:
        url = server.url.replace("postgres@", "crl_app@")
        rl = fresh([url])
        refused = r"cannot update schema 'redlock' \(its functions are at revision 0, "
        with pytest.raises(QuorumUnavailable, match=refused + r".*schema --apply"):
            rl.try_acquire(NAME, ttl=5)
        rl.close()
        owner = fresh(postgres_node1.urls)  # the schema's owner brings them up
        owner.release(owner.acquire(NAME, ttl=5))
        ok = fresh([url])
        ok.release(ok.acquire(NAME, ttl=5))
        ok.close()
    finally:
        server.sql("DROP OWNED BY crl_app")
        server.sql("DROP ROLE crl_app")
