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


#: One node of each kind (built without connecting).
MIXED = ["redis://h1", "postgresql://u@h2/db", "etcd://h3:2379"]


def test_unset_timeouts_are_each_kinds_own_in_both_places():
    """Unset, a node takes its kind's defaults, node by node in a mixed quorum;
    the client's pauses and checks use the longest."""
    assert settings.default("redlock_node_timeout") is None
    assert settings.default("redlock_connect_timeout") is None
    rl = Redlock(MIXED)
    assert [(n.kind, n.timeout, n.connect_timeout) for n in rl.nodes] == [
        ("redis", 0.05, 1.0),
        ("postgres", 0.25, 1.0),
        ("etcd", 0.5, 1.0),
    ]
    assert (rl.node_timeout, rl.connect_timeout) == (0.5, 1.0)
    app = Celery("kinds", set_as_current=False)
    app.conf.update(redlock_nodes=MIXED[1:2])
    resolved = conf.resolve(app)
    assert resolved.node_timeout is None and resolved.connect_timeout is None
    assert resolved.effective_node_timeout() == 0.25
    client = conf.redlock_for(app, resolved)
    assert [(n.timeout, n.connect_timeout) for n in client.nodes] == [(0.25, 1.0)]


def test_a_timeout_set_wins_over_every_kinds_default():
    rl = Redlock(MIXED, node_timeout=0.3, connect_timeout=2.0)
    assert {(n.timeout, n.connect_timeout) for n in rl.nodes} == {(0.3, 2.0)}
    app = Celery("kinds-set", set_as_current=False)
    app.conf.update(redlock_nodes=MIXED[2:], redlock_node_timeout=0.1)
    resolved = conf.resolve(app)
    assert resolved.effective_node_timeout() == 0.1
    assert [n.timeout for n in conf.redlock_for(app, resolved).nodes] == [0.1]


def test_a_kinds_default_timeout_is_checked_against_the_ttl():
    app = Celery("kinds-ttl", set_as_current=False)
    app.conf.update(redlock_nodes=MIXED[1:2], redlock_ttl=0.2)
    with pytest.raises(ImproperlyConfigured, match="default node timeout .* 0.25s must be shorter"):
        conf.resolve(app)
    app.conf.redlock_node_timeout = 0.05  # set: it wins
    assert conf.resolve(app).node_timeout == 0.05


@pytest.mark.parametrize(
    "needed, sizes",
    [(2, [1, 2]), (3, [3, 2]), (3, [1, 1, 1, 1, 1]), (4, [5, 2]), (2, [1, 1]), (5, [4, 5])],
)
def test_a_mixed_rounds_shares_add_up_to_its_quorum(needed, sizes):
    """Each kind of a mixed round ends on its own share of answers: together never
    fewer than the quorum, each at least one and at most its nodes."""
    from celery_redlock.core.nodes import _shares

    shares = _shares(needed, sizes)
    assert sum(shares) >= needed
    assert all(1 <= share <= size for share, size in zip(shares, sizes))
