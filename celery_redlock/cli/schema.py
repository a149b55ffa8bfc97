"""``celery redlock schema``: the SQL of the PostgreSQL lock nodes' schema, printed or applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..core import NodeError, has_schema, install_schema, open_node, schema_sql
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
    option(
        "Schema Options",
        "--url",
        "urls",
        multiple=True,
        metavar="URL",
        help="A PostgreSQL node URL to use instead of the app's (repeatable): the same "
        "database as the app's node, as a role that may create the schema. Give the "
        "app's ?schema= too if it sets one.",
    ),
)
def schema(
    app: Any,
    echo: Callable,
    task: str | None,
    timeout: float,
    apply: bool,
    urls: tuple[str, ...],
    **_: Any,
) -> None:
    """Print the SQL that creates the lock tables and functions of every PostgreSQL lock
    node (of the app, or of TASK), for a DBA or a migration to apply; with --apply, run it.

    A node creates its schema itself on first use when its role may; this is for
    roles that may not. --url names the nodes instead of the app's settings, so
    an admin role applies the schema the app's own role then uses. The SQL is
    idempotent: applying it twice changes nothing.
    """
    if urls and task:
        raise click.UsageError("give TASK or --url, not both")
    if urls:
        label, specs = "--url", list(urls)
    else:
        label, settings = target_settings(app, task)
        specs = list(settings.nodes or ())
    nodes = []
    try:
        for spec in specs:
            nodes.append(open_node(spec, timeout, connect_timeout=max(timeout, 2.0)))
        with_schema = [node for node in nodes if has_schema(node)]
        if urls and len(with_schema) < len(nodes):
            other = next(node for node in nodes if node not in with_schema)
            raise click.BadParameter(f"{other.name} is not a PostgreSQL node", param_hint="--url")
        if not with_schema:
            raise click.ClickException(f"{label} has no PostgreSQL lock node (redlock_nodes)")
        for node in with_schema:
            if apply:
                try:
                    install_schema(node)
                except NodeError as exc:  # refused, or not answering
                    hint = "" if urls else "; to apply it as a role that may, give --url"
                    raise click.ClickException(f"cannot apply the schema: {exc}{hint}") from exc
                echo(f"{node.name}: schema {node.schema!r} is installed")
            else:
                echo(f"-- lock node {node.name}\n{schema_sql(node)}")
    finally:
        for node in nodes:
            node.close()
