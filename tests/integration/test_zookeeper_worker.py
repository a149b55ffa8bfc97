"""A prefork worker whose lock nodes are ZooKeeper: one ensemble of three members
(the deployment of a team that already runs ZooKeeper for Kafka or HBase), and
three one-member ensembles (three lock nodes, a Redlock quorum of 2 of 3). The
etcd worker module's tests, which are the plain suites' own tests of locked,
retried, claimed, debounced, permit-limited and rated tasks, run here
unchanged (imported, not copied) on each. After each topology no lock key is
left, and every claim, schedule and receipt key expires, as on Redis.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.test_etcd_worker import (  # noqa: F401 - fixtures and tests run here
    _nothing_left_without_a_ttl,
    claims_worker,
    coalesce_worker,
    hold,
    test_debounce_runs_once_after_the_burst_with_the_last_arguments,
    test_different_lock_on_values_run_in_parallel,
    test_heartbeat_keeps_the_lock_three_times_past_its_ttl,
    test_limit_3_twenty_tasks_under_retry,
    test_lock_name_shared_by_two_tasks_excludes_across_them,
    test_named_limit_of_2_shared_by_three_tasks,
    test_raise_names_the_claiming_task,
    test_result_of_a_debounced_call_is_the_run_that_replaced_it,
    test_retry_that_runs_out_fails_loudly,
    test_shared_rate_across_tasks,
    test_until_finished_publishes_one_message_for_every_caller,
    test_until_started_keeps_one_running_and_one_waiting,
    two_workers,
)
from tests.support import harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PREFIX = "crl-zk"


#: (ensembles, members of each), by the ids of tests/support/kinds.py's node sets.
SHAPES = {"1zookeeper": (1, 3), "3zookeeper": (3, 1)}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def topology(request: pytest.FixtureRequest):
    from celery_redlock.testing.zookeeper import zookeeper_missing

    why = zookeeper_missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; CI=true requires it")
        pytest.skip(why)
    shape = SHAPES[request.param]
    with harness.make_topology(PREFIX, zookeeper=True, zookeeper_shape=shape) as topo:
        yield topo
        topo.assert_nothing_left()
