"""``celery redlock status`` and ``release`` on a queued key (lock_on_duplicate
"queue"), on three real redis-server nodes: status shows the queue (how many
wait, the next call and its age, a hand-over not started yet), and a forced
release hands the key to the next call without losing the queue."""

from __future__ import annotations

import json
import time

import pytest

from celery_redlock import plan_of
from celery_redlock.core import make_owner
from tests.integration import cli_app
from tests.integration.test_cli import invoke

pytestmark = pytest.mark.integration


@pytest.fixture
def app(redis_nodes3):
    return cli_app.make_app(redis_nodes3.urls)


def test_status_shows_the_queue_and_release_hands_it_on(app):
    task = app.tasks[cli_app.QUEUED]
    plan = plan_of(task)
    name = plan.keys.build([5], {})
    lease = plan.redlock.acquire(name, ttl=60, owner=make_owner("holder-1", 0))
    assert lease is not None
    sent = [task.delay(5, step=i).id for i in range(3)]  # parked: the key is held
    time.sleep(0.2)

    result = invoke(app, "status", cli_app.QUEUED, "--args", "[5]")
    assert result.exit_code == 0, result.output
    assert "3 waiting (queue)" in result.output
    assert f"Next call:    task {sent[0]}, waiting for 0." in result.output
    out = json.loads(invoke(app, "status", cli_app.QUEUED, "--args", "[5]", "--json").output)
    assert out["queue"]["waiting"] == 3 and out["queue"]["next"] == sent[0]
    assert 0.2 <= out["queue"]["oldest_age"] < 10 and out["queue"]["handed_to"] is None

    result = invoke(app, "release", cli_app.QUEUED, "--args", "[5]", "--force")
    assert result.exit_code == 0, result.output
    assert f"Handed the key to task {sent[0]} (3 waiting, counting it)." in result.output
    out = json.loads(invoke(app, "status", cli_app.QUEUED, "--args", "[5]", "--json").output)
    assert out["held"] is False
    assert out["queue"]["waiting"] == 3 and out["queue"]["handed_to"] == sent[0]
