"""The worker fault tests of ``test_task_faults.py`` on a ZooKeeper lock node:
a holder frozen (SIGSTOP) past its TTL loses its lease and its fenced write is
refused, a killed holder's lock or permit is freed at once. Imported, not
copied: this module's topology is one ZooKeeper ensemble of three members as
the lock node (the deployment docs/zookeeper.rst advises)."""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    from celery_redlock.testing.zookeeper import zookeeper_missing

    require(zookeeper_missing())
    # The tasks keep lockapp's TTLs (1.5 s for the frozen holders): ZooKeeper has no
    # floor under a TTL, and a paused holder's key is free within its TTL plus two
    # round trips of its last renewal (docs/zookeeper.rst, "Expiry"), so the bounds
    # the tests check are the ones they check on Redis. The node timeout is
    # make_topology's 0.5 s, the low end of the docs' 0.5-2 s: a node timeout must be
    # shorter than the TTL (ZooKeeper's default 2 s would refuse 1.5 s at bind), and a
    # commit on loopback takes milliseconds; no member is hurt here, so no election.
    with harness.make_topology("crl-zk-faults", zookeeper=True) as topo:
        yield topo
        topo.assert_nothing_left()
