"""``celery redlock nodes`` on lock nodes given in Celery's broker-list
spelling: a ``;``-separated string is three nodes, not one."""

from __future__ import annotations

import cli_app
import pytest

from tests.integration.test_cli import invoke

pytestmark = pytest.mark.integration


def test_nodes_lists_every_node_of_a_semicolon_separated_string(redis_nodes3):
    app = cli_app.make_app([], redlock_nodes=";".join(redis_nodes3.urls))
    result = invoke(app, "nodes")
    assert result.exit_code == 0, result.output
    for url in redis_nodes3.urls:
        assert url in result.output
    assert "3 of 3 nodes answered, 2 needed" in result.output
    assert "ONE node" not in result.output
