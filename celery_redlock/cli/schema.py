"""``celery redlock schema``: the SQL of the PostgreSQL lock nodes' schema, printed or applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..core.nodes import kind_of, node_for
from .base import TASK, command, option
from .targets import target_settings

__all__ = ["schema"]


@command(
    "schema",
    TASK,
    option(
        "Schema Options",
        "--apply",
        is_flag=True,
        help="Create (or bring up to date) the schema on each PostgreSQL node now, instead "
        "of printing its SQL.",
    ),
)
def schema(
    app: Any, echo: Callable, task: str | None, timeout: float, apply: bool, **_: Any
) -> None:
    """Print the SQL that creates the lock tables and functions of every PostgreSQL lock
    node (of the app, or of TASK), for a DBA or a migration to apply; with --apply, run it.

    A node creates its schema itself on first use when its role may; this is for
    roles that may not. The SQL is idempotent: applying it twice changes nothing.
    """
    label, settings = target_settings(app, task)
    nodes = [
        node_for(url, timeout, connect_timeout=max(timeout, 2.0)) for url in settings.nodes or ()
    ]
    try:
        with_schema = [node for node in nodes if kind_of(node).has_schema]
        if not with_schema:
            raise click.ClickException(f"{label} has no PostgreSQL lock node (redlock_nodes)")
        for node in with_schema:
            kind = kind_of(node)
            if apply:
                kind.install(node)
                echo(f"{node.name}: schema {node.schema!r} is installed")
            else:
                echo(f"-- lock node {node.name}\n{kind.ddl(node.schema)}")
    finally:
        for node in nodes:
            node.close()
