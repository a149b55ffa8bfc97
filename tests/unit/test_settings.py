"""One declaration per setting serves Redlock(...) and app.conf alike; one quorum rule."""

from __future__ import annotations

import math

import fakeredis
import pytest
from celery import Celery

from celery_redlock import (
    ConfigurationError,
    ImproperlyConfigured,
    QuorumUnavailable,
    Redlock,
    conf,
    settings,
)


def fake_redlock(n: int = 3) -> Redlock:
    clients = [fakeredis.FakeRedis(server=fakeredis.FakeServer()) for _ in range(n)]
    return Redlock(clients, node_timeout=1.0)  # a new connection opens on a thread


@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, True, "1"])
def test_one_rule_for_a_duration_in_both_places(value):
    with pytest.raises(ConfigurationError, match="node_timeout must be a positive number"):
        Redlock(["redis://h1", "redis://h2", "redis://h3"], node_timeout=value)
    app = Celery("durations", set_as_current=False)
    app.conf.update(redlock_nodes=["redis://h1"], redlock_node_timeout=value)
    with pytest.raises(ImproperlyConfigured, match="redlock_node_timeout = .* must be a positive"):
        conf.resolve(app)


@pytest.mark.parametrize(
    "name, value",
    [("drift_factor", 1), ("drift_factor", -0.1), ("key_prefix", "a{b}"), ("key_prefix", "")],
)
def test_drift_and_prefix_checked_by_the_same_declaration(name, value):
    with pytest.raises(ConfigurationError, match=name) as direct:
        Redlock(["redis://h1"], **{name: value})
    app = Celery("checks", set_as_current=False)
    app.conf.update({"redlock_nodes": ["redis://h1"], f"redlock_{name}": value})
    with pytest.raises(ImproperlyConfigured) as via_conf:
        conf.resolve(app)
    reason = str(via_conf.value).rsplit(repr(value) + " ", 1)[1]
    assert reason in str(direct.value)


def test_a_wait_timeout_may_be_unlimited():
    assert settings.check_timeout(math.inf) == math.inf
    with pytest.raises(ValueError):
        settings.check_seconds(math.inf)


def test_has_quorum_counts_all_configured_nodes():
    rl = fake_redlock(5)
    assert rl.quorum == 3
    assert [rl.has_quorum(n) for n in range(6)] == [False, False, False, True, True, True]


def test_check_quorum_raises_for_too_few_answers():
    rl = fake_redlock(3)
    down = ConnectionError("down")
    rl.check_quorum([1, 1, down])  # two of three answered: enough
    with pytest.raises(QuorumUnavailable) as info:
        rl.check_quorum([1, down, down])
    assert info.value.quorum == 2 and info.value.total == 3 and len(info.value.errors) == 2


def test_declarations_are_unique_and_documented():
    declared = settings.SETTINGS + settings.BEAT_SETTINGS + settings.WORKER_SETTINGS
    names = [s.name for s in declared]
    assert len(names) == len(set(names))
    assert all(s.doc and s.name.startswith("redlock_") for s in declared)
    assert settings.by_name("redlock_ttl").default == settings.default("redlock_ttl") == 10.0
