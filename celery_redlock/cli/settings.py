"""``celery redlock settings``: every redlock_* setting, its value, source and meaning."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import click

from .. import conf
from .._format import setting_text, table
from .._reading import OWNER
from ..exceptions import ConfigurationError
from .base import TASK, command
from .targets import plan_named

__all__ = ["settings_"]


@command("settings", TASK, timeout=False)
def settings_(app: Any, echo: Callable, task: str | None, **kwargs: Any) -> None:
    """Print every redlock_* setting: resolved value, where it comes from, meaning.

    With TASK, the values that task uses (its lock_* attributes win over
    app.conf). Passwords in node URLs are masked.
    """
    resolved: conf.LockSettings | None = None
    problem = None
    if task:
        resolved = plan_named(app, task).resolved
    else:
        try:
            resolved = conf.resolve(app, owner=OWNER)
        except ConfigurationError as exc:
            problem = str(exc)
    values = conf.provenance(app, app.tasks[task] if task else None, resolved)
    rows = [[v.name, v.source, setting_text(v.value)] for v in values]
    echo(f"Settings of {f'task {task}' if task else 'the app'}\n")
    head, *lines = table(rows, ["SETTING", "FROM", "VALUE"]).split("\n")
    echo(head)
    for line, setting in zip(lines, conf.SETTINGS):
        echo("\n".join([line] + ["    " + doc for doc in textwrap.wrap(setting.doc, 76)]))
    if problem:
        raise click.ClickException(f"configuration: {problem}")
