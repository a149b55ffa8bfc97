"""The scaffolding of the ``celery redlock`` commands: the click group, the shared
options, and the decorator that turns the library's errors into exit codes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
from celery.bin.base import (
    JSON_ARRAY,
    JSON_OBJECT,
    CeleryCommand,
    CeleryOption,
    handle_preload_options,
)

from ..exceptions import (
    ConfigurationError,
    LockKeyError,
    NodeError,
    QuorumUnavailable,
    RedlockError,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "EX_DEGRADED",
    "EX_NEEDS_FIX",
    "EX_UNAVAILABLE",
    "LIMIT",
    "LOCK",
    "TASK",
    "Degraded",
    "NeedsFix",
    "Unavailable",
    "command",
    "option",
    "redlock",
]

#: Default seconds per node and round for the CLI's own connections.
DEFAULT_TIMEOUT = 0.5
#: Exit code when fewer than a quorum of nodes answered.
EX_UNAVAILABLE = 2
#: Exit code of ``nodes`` when a node is down but a quorum answered.
EX_DEGRADED = 3
#: Exit code of ``nodes`` when a node's error cannot heal without a fix (a
#: password refused, a database or schema missing, a TLS certificate not verified).
EX_NEEDS_FIX = 4


class Unavailable(click.ClickException):
    """Fewer than a quorum of the lock nodes answered, or a node failed."""

    exit_code = EX_UNAVAILABLE


class Degraded(click.ClickException):
    """A node did not answer, but a quorum did: locks work, with less to spare."""

    exit_code = EX_DEGRADED


class NeedsFix(click.ClickException):
    """A node's error cannot heal by waiting: someone must fix the node or its URL."""

    exit_code = EX_NEEDS_FIX


@click.group(name="redlock")
def redlock() -> None:
    """Inspect and clear celery_redlock locks and beat claims.

    Exit codes: 0 done, 1 bad input or nothing done, 2 fewer than a quorum of
    the lock nodes answered, 3 (nodes only) a node is down but a quorum
    answered.
    """


def option(group: str, *decls: str, **attrs: Any) -> Callable[..., Any]:
    """A click option shown under ``group`` in the command's help."""
    return click.option(*decls, cls=CeleryOption, help_group=group, **attrs)


TASK = click.argument("task", required=False)
TIMEOUT = option(
    "Connection Options",
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds each lock node gets to answer one round.",
)
LIMIT = option(
    "Listing Options",
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Stop after this many keys per node.",
)
#: TASK with --args/--kwargs, or --name: which lock a command is about (see
#: :func:`celery_redlock.cli.targets.lock_target`).
LOCK = (
    TASK,
    option(
        "Lock Options",
        "--args",
        "args_",
        type=JSON_ARRAY,
        help="The task's positional arguments as a JSON array: the whole call, or the "
        "lock_on arguments alone, in lock_on order.",
    ),
    option(
        "Lock Options",
        "--kwargs",
        "kwargs_",
        type=JSON_OBJECT,
        help="The task's keyword arguments as a JSON object: the whole call's, or the "
        "lock_on arguments alone, by name.",
    ),
    option(
        "Lock Options",
        "--name",
        "lock_name",
        help="A lock name as the list command shows it (or its full key on the nodes), instead of "
        "TASK and its arguments. With TASK too, TASK only picks the nodes and prefix.",
    ),
)


def command(name: str, *params: Callable[..., Any], timeout: bool = True) -> Callable[..., Any]:
    """A sub-command called as ``f(app, echo, **params)``, with --timeout unless told not.

    The library's and the lock nodes' errors become one-line messages and exit codes.
    """

    def decorate(f: Callable[..., None]) -> click.Command:
        @functools.wraps(f)
        def run(ctx: click.Context, *args: Any, **kwargs: Any) -> None:
            try:
                f(ctx.obj.app, ctx.obj.echo, *args, **kwargs)
            except QuorumUnavailable as exc:
                raise Unavailable(f"lock quorum unavailable: {exc}") from exc
            except ConfigurationError as exc:
                raise click.ClickException(f"configuration: {exc}") from exc
            except LockKeyError as exc:
                raise click.ClickException(f"cannot build the lock key: {exc}") from exc
            except NodeError as exc:  # not OSError: a closed stdout pipe is no node's outage
                raise Unavailable(f"lock node error: {exc}") from exc
            except RedlockError as exc:
                raise click.ClickException(str(exc)) from exc

        wrapped = click.pass_context(handle_preload_options(run))
        for param in reversed((*params, TIMEOUT) if timeout else params):
            wrapped = param(wrapped)
        return redlock.command(name=name, cls=CeleryCommand)(wrapped)

    return decorate
