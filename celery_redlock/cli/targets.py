"""Which task, settings and lock a ``celery redlock`` command is about."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .. import conf
from .._reading import OWNER, locked_plans
from ..exceptions import LockKeyError

if TYPE_CHECKING:
    from ..plan import LockPlan

__all__ = ["lock_key", "lock_target", "plan_named", "target_settings"]


def plan_named(app: Any, task: str) -> LockPlan:
    """The lock plan of the app's LockedTask ``task``; a usage error naming the others if none."""
    plans = locked_plans(app)
    if task in plans:
        return plans[task]
    what = "is not a LockedTask" if task in app.tasks else "is not a task registered in the app"
    known = ", ".join(plans) or "none"
    raise click.ClickException(f"{task!r} {what}. The app's LockedTasks: {known}")


def target_settings(app: Any, task: str | None) -> tuple[str, conf.LockSettings]:
    """(label, settings) of ``task``, or of the app without one."""
    if task:
        return f"task {task}", plan_named(app, task).resolved
    return "the app", conf.resolve(app, owner=OWNER)


def lock_target(
    app: Any,
    task: str | None,
    args_: list | None,
    kwargs_: dict | None,
    lock_name: str | None,
    **preload_options: Any,
) -> tuple[str, conf.LockSettings, str, tuple[list, dict] | None]:
    """(label, settings, lock name, the whole call or None) of the one lock a command is about."""
    if not lock_name:
        if not task:
            raise click.UsageError(
                "name a lock: TASK [--args JSON] [--kwargs JSON], or --name LOCK"
            )
        plan = plan_named(app, task)
        name, whole = lock_key(plan, args_ or [], kwargs_ or {})
        return f"task {task}", plan.resolved, name, (args_ or [], kwargs_ or {}) if whole else None
    if args_ is not None or kwargs_ is not None:
        raise click.UsageError("--name takes no --args/--kwargs: the name already includes them")
    label, settings = target_settings(app, task)
    # Accept the Redis key itself, as redis-cli shows it.
    full = f"{settings.key_prefix}:lock:"
    name = lock_name[len(full) :] if lock_name.startswith(full) else lock_name
    return label, settings, name, None


def lock_key(plan: LockPlan, args: list, kwargs: dict) -> tuple[str, bool]:
    """(lock name, whether it is the whole call's) for the arguments an operator gave.

    They may be the whole call of the task, or its ``lock_on`` arguments alone
    (an order id without the amount). Arguments that fit both ways with
    different keys are refused rather than guessed at.
    """
    keys = plan.keys
    try:
        whole: str | None = keys.build(args, kwargs)
    except LockKeyError as exc:
        whole, whole_error = None, exc
    try:
        alone: str | None = keys.build_selected(args, kwargs)
    except LockKeyError as exc:
        alone, alone_error = None, exc
    if whole is not None and alone is not None and whole != alone:
        raise click.ClickException(
            f"the arguments fit both the whole call of {keys.task_name} and its lock_on "
            f"arguments ({keys.lock_on!r}), with different keys; name them with --kwargs"
        )
    if whole is not None:
        return whole, True
    if alone is not None:
        return alone, False
    raise LockKeyError(f"{whole_error}; nor are they the lock_on arguments alone: {alone_error}")
