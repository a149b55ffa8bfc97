"""The worker fault tests of ``test_task_faults.py`` on an etcd lock node: a
holder frozen (SIGSTOP) past its TTL loses its lease and its fenced write is
refused, a killed holder's lock or permit is freed at once. Imported, not
copied: this module's topology is one etcd cluster (of one member) as the lock
node, the tasks' lock TTLs raised to etcd's 2 s floor."""

from __future__ import annotations

import os
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

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    from celery_redlock.testing.etcd import etcd_missing

    why = etcd_missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; CI=true requires it")
        pytest.skip(why)
    with harness.make_topology("crl-etcd-faults", etcd=True) as topo:
        yield topo
        topo.assert_nothing_left()
