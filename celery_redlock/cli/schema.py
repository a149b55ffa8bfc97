"""``celery redlock schema``: the SQL of the PostgreSQL lock nodes' schema, printed or applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..core.nodes import KINDS, node_for
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
    urls = [
        url
        for url in settings.nodes or ()
        if isinstance(url, str) and KINDS.get(url.partition("://")[0]) == "postgres"
    ]
    if not urls:
        raise click.ClickException(f"{label} has no PostgreSQL lock node (redlock_nodes)")
    from ..core.nodes import postgres

    for url in urls:
        node = node_for(url, timeout, connect_timeout=max(timeout, 2.0))
        try:
            if apply:
                postgres.install(node)
                echo(f"{node.name}: schema {node.schema!r} is installed")
            else:
                echo(f"-- lock node {node.name}\n{postgres.ddl(node.schema)}")
        finally:
            node.close()
