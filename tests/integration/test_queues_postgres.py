"""Queues and supersede on a prefork worker whose lock node is a PostgreSQL
database: the Redis suites' own tests run here unchanged (imported, not
copied), the queue primitives running as PL/pgSQL."""

from __future__ import annotations

import pytest

from tests.integration.test_queues_live import (  # noqa: F401 - tests run here
    test_a_full_queue_answers_revoked_at_once,
    test_a_killed_holder_hands_the_queue_on_in_order,
    test_four_producers_each_see_their_own_order,
    test_thirty_calls_run_in_publish_order_while_unlocked_work_starts_promptly,
)
from tests.integration.test_supersede_live import (  # noqa: F401
    test_a_checking_holder_stops_for_a_newer_call,
    test_a_holder_that_never_checks_finishes_and_the_newest_runs_after_it,
)
from tests.support import harness
from tests.support.postgres import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PREFIX = "crl-pgq"


@pytest.fixture(scope="module")
def topology():
    from celery_redlock.testing.postgres import postgres_missing

    require(postgres_missing())
    with harness.make_topology(PREFIX, postgres=True) as topo:
        yield topo
        topo.assert_nothing_left()
