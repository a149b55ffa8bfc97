"""What the tools read: the app's locked tasks, the nodes they use, a key's report.

Shared by the CLI (:mod:`celery_redlock.cli`) and the dashboard
(:mod:`celery_redlock.web`), on the core's public API only.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import conf
from ._format import KeyReport
from .core import Redlock
from .exceptions import ConfigurationError
from .plan import plan_of
from .task import LockedTask

if TYPE_CHECKING:
    from .plan import LockPlan

__all__ = ["OWNER", "all_settings", "connect", "key_report", "locked_plans"]

#: Named in configuration errors raised while resolving the app-level settings.
OWNER = "celery redlock"


def locked_plans(app: Any) -> dict[str, LockPlan]:
    """The lock plans of the app's LockedTasks by task name (after importing its task modules)."""
    app.loader.import_default_modules()
    plans = {}
    for name, task in sorted(app.tasks.items()):
        plan = plan_of(task) if isinstance(task, LockedTask) else None
        if plan is not None:
            plans[name] = plan
    return plans


def all_settings(app: Any) -> list[tuple[str, conf.LockSettings]]:
    """Each distinct (nodes, prefix) the app and its LockedTasks use, with who uses it."""
    candidates = []
    try:
        candidates.append(("the app", conf.resolve(app, owner=OWNER)))
    except ConfigurationError:
        pass  # every task may name its own nodes; fail below only if none does
    candidates += [(f"task {name}", plan.resolved) for name, plan in locked_plans(app).items()]
    if not candidates:
        conf.resolve(app, owner=OWNER)  # raises the configuration error
    groups: dict[tuple, tuple[list[str], conf.LockSettings]] = {}
    for label, settings in candidates:
        nodes = tuple(n if isinstance(n, str) else id(n) for n in settings.node_list)
        groups.setdefault((nodes, settings.key_prefix), ([], settings))[0].append(label)
    if len(groups) == 1:  # the usual case: everyone shares the app's nodes
        return candidates[:1]
    return [(", ".join(labels), settings) for labels, settings in groups.values()]


@contextmanager
def connect(settings: conf.LockSettings, timeout: float) -> Iterator[tuple[Redlock, list[str]]]:
    """A Redlock on ``settings``' nodes with the CLI's timeout, and its construction warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # report "use an odd number of nodes" in the output
        options = {**settings.redlock_options(), "node_timeout": timeout}
        client = Redlock(settings.node_list, **options)
    try:
        yield client, [str(w.message) for w in caught]
    finally:
        client.close()


def key_report(
    client: Redlock, key: str, fence_key: str | None = None, skip: dict[str, str] | None = None
) -> KeyReport:
    """``key`` as every node holds it, with the holder a quorum agrees on."""
    views = client.inspect_key(key, fence_key, skip=skip)
    return KeyReport(views, client.quorum, client.agreed(views))
