"""A prefork worker whose three lock nodes are Redis Clusters of three masters.

The plain-master suites' own tests run here unchanged on cluster nodes
(imported, not copied): the module's ``topology`` is three clusters, so every
worker fixture of those suites locks on them. Locked tasks (exclusion,
tokens, the heartbeat), enqueue claims, debounce and permits; after each test
no lock key is left, and every claim, schedule and receipt key expires. The
worker refuses ``lock_also`` across names on cluster nodes at bind
(:func:`celery_redlock.core.check_together`).
"""

from __future__ import annotations

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured

from celery_redlock import LockedTask
from tests.integration.test_coalesce import (  # noqa: F401 - fixtures and tests run here
    _nothing_left_without_a_ttl,  # after each test: no lock key, every other key expires
    coalesce_worker,
    test_debounce_runs_once_after_the_burst_with_the_last_arguments,
    test_result_of_a_debounced_call_is_the_run_that_replaced_it,
)
from tests.integration.test_enqueue import (  # noqa: F401
    hold,
    start_claims_worker,
    test_raise_names_the_claiming_task,
    test_until_finished_publishes_one_message_for_every_caller,
    test_until_started_keeps_one_running_and_one_waiting,
)
from tests.integration.test_locked_task import (  # noqa: F401
    test_different_lock_on_values_run_in_parallel,
    test_heartbeat_keeps_the_lock_three_times_past_its_ttl,
    test_lock_name_shared_by_two_tasks_excludes_across_them,
    test_retry_that_runs_out_fails_loudly,
)
from tests.integration.test_permits_live import test_limit_3_twenty_tasks_under_retry  # noqa: F401
from tests.support import harness
from tests.support.harness import Topology

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: The claims' worker on the Redis broker alone: the broker is not what these lock
#: nodes change, and test_enqueue.py runs the same tests on RabbitMQ too.
claims_worker = pytest.fixture(scope="module", params=["redis"], name="claims_worker")(
    start_claims_worker
)

PREFIX = "crl-cl"


@pytest.fixture(scope="module")
def topology():
    with harness.make_topology(PREFIX, clusters=True) as topo:
        yield topo
        topo.assert_nothing_left()


def test_lock_also_is_refused_at_bind_on_cluster_nodes(topology: Topology):
    app = Celery("cluster-also", set_as_current=False)
    app.conf.redlock_nodes = topology.quorum.urls

    with pytest.raises(ImproperlyConfigured, match=r"lock_also: .*Redis Cluster"):

        @app.task(base=LockedTask, shared=False, lock_on=("key",), lock_also={"crl-api": 2})
        def key_and_api(key):
            return key

        app.finalize()
        key_and_api.bind(app)
