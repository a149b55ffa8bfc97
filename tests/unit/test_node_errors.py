"""NodeError: one kind-neutral node failure, and whether it can heal by waiting."""

from __future__ import annotations

import pickle

import pytest

from celery_redlock import ConfigurationError, NodeError, QuorumUnavailable
from celery_redlock.core.exceptions import heals
from celery_redlock.core.nodes.etcd import NodeError as EtcdNodeError
from celery_redlock.core.nodes.postgres import NodeError as PostgresNodeError
from celery_redlock.outage import cause_and_fix


def test_each_kinds_error_is_a_node_error_and_a_connection_error():
    for cls in (NodeError, EtcdNodeError, PostgresNodeError):
        error = cls("postgresql://n: refused", "postgresql://n", heals=False)
        assert isinstance(error, NodeError) and isinstance(error, ConnectionError)
        assert (error.node, error.heals) == ("postgresql://n", False)
        again = pickle.loads(pickle.dumps(error))
        assert (type(again), str(again), again.node, again.heals) == (
            cls,
            str(error),
            error.node,
            error.heals,
        )


def test_what_heals():
    assert heals(NodeError("down")) and heals(TimeoutError("slow")) and heals("timeout")
    assert not heals(NodeError("refused", heals=False))
    assert not heals(ConfigurationError("the node is misconfigured"))


@pytest.mark.parametrize(
    ("unhealed", "total", "heals_"), [(0, 3, True), (1, 3, True), (2, 3, False), (1, 1, False)]
)
def test_a_quorum_heals_while_the_nodes_that_cannot_leave_enough(unhealed, total, heals_):
    errors: dict = {f"n{i}": NodeError("no", heals=False) for i in range(unhealed)}
    errors.update({f"m{i}": TimeoutError("t") for i in range(total - unhealed)})
    exc = QuorumUnavailable(errors, total // 2 + 1, total)
    assert exc.heals is heals_
    assert len(exc.unhealed) == unhealed
    assert pickle.loads(pickle.dumps(exc)).heals  # as text, after a result backend: unknown


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ('password authentication failed for user "app"', "set the right user and password"),
        ('FATAL:  database "x" does not exist', "create that database"),
        ("cannot create schema 'redlock' (...); run `celery redlock schema --apply`", None),
        ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", "give the CA"),
        ("WRONGPASS invalid username-password pair", "set the right user and password"),
    ],
)
def test_cause_and_fix_names_the_node_once_and_the_fix(text, fix):
    node = "postgresql://app:***@db:5432/locks"
    line = cause_and_fix(node, NodeError(f"{node}: {text}", node, heals=False))
    assert line.count(node) == 1 and text in line
    if fix is None:
        assert "(fix:" not in line  # the error names its own
    else:
        assert f"(fix: {fix}" in line
    assert cause_and_fix(node, text).startswith(f"{node}: {text}")
