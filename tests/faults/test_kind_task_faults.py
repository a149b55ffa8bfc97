"""The worker fault tests of ``test_task_faults.py`` on each other kind of lock
node: a holder frozen (SIGSTOP) past its TTL loses its lease and its fenced
write is refused, a killed holder's lock or permit is freed at once. Imported,
not copied: this module's topology is one node of the kind, the deployment its
docs page advises (one PostgreSQL server, one etcd cluster of one member with
the tasks' TTLs raised to its 2 s lease floor, one ZooKeeper ensemble of three
members).

ZooKeeper keeps lockapp's TTLs (1.5 s for the frozen holders): it has no floor
under a TTL, and a paused holder's key is free within its TTL plus two round
trips of its last renewal (docs/zookeeper.rst, "Expiry"), so the bounds the
tests check are the ones they check on Redis. The node timeout is
make_topology's 0.5 s, the low end of the docs' 0.5-2 s for ZooKeeper: a node
timeout must be shorter than the TTL, and no member is hurt here."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from tests.faults.test_task_faults import (  # noqa: F401 - fixtures and tests run here
    _no_lock_left_behind,
    run,
    test_frozen_holder_loses_the_lock_and_its_fenced_write_is_rejected,
    test_frozen_permit_holder_loses_its_permit_and_its_fenced_write_is_rejected,
    test_sigkill_of_the_holder_child_frees_the_lock_at_once,
    workers,
)
from tests.support import harness
from tests.support.harness import Topology
from tests.support.postgres import require

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


@pytest.fixture(scope="module", params=["postgres", "etcd", "zookeeper"])
def topology(request: pytest.FixtureRequest) -> Iterator[Topology]:
    kind = request.param
    testing = importlib.import_module(f"celery_redlock.testing.{kind}")
    require(getattr(testing, f"{kind}_missing")())
    with harness.make_topology(f"crl-{kind}-faults", **{kind: True}) as topo:
        yield topo
        topo.assert_nothing_left()
