"""What the logs say about the nodes, on real servers: a lock freed by an
operator is reported as freed, not as a lost quorum; no release line for a
lock that was never taken; a node named once per line."""

from __future__ import annotations

import logging

import cli_app
import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redlock import outage, plan_of, signals
from celery_redlock.cli import redlock as redlock_cli
from celery_redlock.core.heartbeat import Heartbeat
from celery_redlock.core.held import FREED, NO_QUORUM
from celery_redlock.exceptions import LockLost, QuorumUnavailable
from celery_redlock.redlock import Redlock, make_owner
from celery_redlock.testing import free_port

pytestmark = pytest.mark.integration

#: Generous, so that a loaded test machine is not mistaken for a node outage.
NODE_TIMEOUT = 0.5
INTERVAL = 1.0


def release_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "did not reach" in r.getMessage()]


def lost_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if " lost: " in r.getMessage()]


@pytest.mark.parametrize("how", ["cli", "core"])
def test_an_operator_release_is_reported_as_freed_not_as_a_lost_quorum(redis_nodes3, caplog, how):
    app = cli_app.make_app(redis_nodes3.urls, redlock_node_timeout=NODE_TIMEOUT)
    task = app.tasks[cli_app.SETTLE]
    plan = plan_of(task)
    client = plan.redlock
    name = plan.keys.build([7], {})
    lease = client.acquire(name, ttl=30, owner=make_owner("task-aaa", 0))
    assert lease is not None
    beat = Heartbeat(autostart=False)
    heard = []
    beat.hold(lease, INTERVAL, on_lost=heard.append)

    if how == "cli":  # the operator's command, as it runs under `celery redlock`
        result = CliRunner().invoke(
            redlock_cli,
            ["release", cli_app.SETTLE, "--args", "[7]", "--force"],
            obj=CLIContext(app=app, no_color=True, workdir=None),
        )
        assert result.exit_code == 0 and "on 3 of 3 nodes" in result.output, result.output
    else:  # the core's public API for the same: the key deleted whatever its owner
        assert sum(d.deleted for d in client.force_release(name)) == 3

    with caplog.at_level(logging.INFO, logger="celery_redlock"):
        beat.renew_once(beat.clock() + INTERVAL)  # every node answers: the key is gone
    assert heard == [lease] and lease.lost and beat.held() == []
    assert lease.lost_reason == FREED
    (line,) = lost_lines(caplog)
    assert line == f"lock {lease.key!r} lost: {FREED}; no longer renewed"
    assert NO_QUORUM not in line and "an operator's release" in line
    with pytest.raises(LockLost, match="freed or taken there while held"):
        lease.check()

    said = []

    def receiver(sender, lease, reason, **_):
        said.append(reason)

    signals.lock_lost.connect(receiver, weak=False)
    try:
        task._lock_lost(lease)  # what the task layer's on_lost sends
    finally:
        signals.lock_lost.disconnect(receiver)
    assert said == [FREED]
    client.close()


def test_a_majority_down_is_still_a_lost_quorum(redis_node_factory, caplog):
    nodes = redis_node_factory(3)
    client = Redlock(nodes.urls, node_timeout=NODE_TIMEOUT)
    lease = client.acquire("log-quorum", ttl=30)
    assert lease is not None
    beat = Heartbeat(autostart=False)
    beat.hold(lease, INTERVAL)
    nodes.kill(0)
    nodes.kill(1)
    with caplog.at_level(logging.WARNING, logger="celery_redlock.heartbeat"):
        beat.renew_once(beat.clock() + INTERVAL)
    (line,) = lost_lines(caplog)
    assert NO_QUORUM in line and FREED not in line
    assert lease.lost_reason == NO_QUORUM
    client.close()


def test_a_majority_down_during_an_acquire_logs_no_release_line(redis_node_factory, caplog):
    nodes = redis_node_factory(3)
    client = Redlock(nodes.urls, node_timeout=NODE_TIMEOUT)
    nodes.kill(0)
    nodes.kill(1)
    with caplog.at_level(logging.INFO, logger="celery_redlock"):
        for attempt in range(5):
            with pytest.raises(QuorumUnavailable):
                client.try_acquire(f"log-never-{attempt}", ttl=5)
            with pytest.raises(QuorumUnavailable):  # a beat slot's claim, the same
                client.claim(f"slot-never-{attempt}", "beat-1", ttl=5)
    # the one node up granted each, and its clean-up release reached it: nothing left
    assert release_lines(caplog) == []
    with nodes[2].client() as up:
        assert up.keys("redlock:lock:*log-never*") == []
    client.close()


def test_a_held_lock_whose_release_misses_a_node_names_it_once(redis_node_factory, caplog):
    nodes = redis_node_factory(3)
    client = Redlock(nodes.urls, node_timeout=NODE_TIMEOUT)
    lease = client.acquire("log-held", ttl=5)
    assert lease is not None
    nodes.kill(0)
    with caplog.at_level(logging.INFO, logger="celery_redlock"):
        client.release(lease)
    (line,) = release_lines(caplog)
    assert line.count(nodes[0].url) == 1
    assert nodes[1].url not in line and nodes[2].url not in line
    client.close()


def test_the_outage_line_names_each_node_once(caplog):
    pytest.importorskip("psycopg")
    url = f"postgresql://app:s3cret@127.0.0.1:{free_port()}/shop"  # nothing listens there
    client = Redlock([url], node_timeout=NODE_TIMEOUT)
    shown = client.nodes[0].name
    with pytest.raises(QuorumUnavailable) as info:
        client.try_acquire("log-outage", ttl=5)
    assert str(info.value).count(shown) == 1, str(info.value)
    with caplog.at_level(logging.WARNING, logger="celery_redlock.outage"):
        assert outage.failed(client, info.value)
    outage.answered(client)
    (line,) = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert line.count(shown) == 1 and "s3cret" not in line, line
    assert release_lines(caplog) == []
    client.close()
