"""``celery redlock status``: who holds one lock, the quorum's view and every node's."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .. import queues, rates
from .._format import table, view_cells
from .._reading import connect, key_report
from .base import LOCK, Unavailable, command, option
from .listing import remaining_text
from .targets import lock_target

__all__ = ["status"]


@command(
    "status",
    *LOCK,
    option(
        "Output Options",
        "--json",
        "as_json",
        is_flag=True,
        help="Print one JSON object instead of text.",
    ),
)
def status(app: Any, echo: Callable, as_json: bool, timeout: float, **options: Any) -> None:
    """Show who holds one lock: the quorum's view and every node's.

    With lock_limit K > 1, every permit of the key with its holder and the
    TTL left (the node table is permit 0's, the lock key). A queued key
    (lock_on_duplicate queue or supersede): how many calls wait, the next
    call's task id and how long it has waited, and a hand-over not started yet.

    The lock is TASK's for the arguments given with --args/--kwargs (the key
    is computed exactly as the worker computes it), or --name. TASK must be a
    LockedTask of the app. The arguments may be the whole call or the lock_on
    arguments alone (--args in lock_on order, or --kwargs by name).
    """
    label, settings, name, call = lock_target(app, **options)
    with connect(settings, timeout) as (client, _):
        key, fence_key = client.keys(name)
        lock = key_report(client, key, fence_key)
        # With lock_limit K > 1: permit 0 is the lock key, read above; the others.
        permits = [lock] + [
            key_report(client, k, skip=dict(lock.down))
            for k in client.permit_keys(name, settings.limit)[1:]
        ]
        # A rate callable needs the whole call, not the lock_on arguments alone.
        rate_rows, rate = rates.status(client, settings, name, *(call or (None, None)))
        queue_rows, queue = queues.status(client, settings, name)
    holder, problem = lock.holder, lock.outage()
    if as_json:
        out: dict[str, Any] = {
            "settings_of": label,
            "name": name,
            "key": key,
            "fence_key": fence_key,
            "quorum": lock.quorum,
            "nodes_total": len(lock.views),
            "answered": lock.answered,
            "held": holder.owner is not None,
            "holder": None,
            "nodes": lock.as_json(),
        }
        if holder.owner is not None:
            out["holder"] = {
                "owner": holder.owner,
                "task_id": holder.task_id,
                "remaining": holder.remaining,
                "nodes": lock.votes,
            }
        if settings.limit > 1:
            out["limit"] = settings.limit
            out["permits"] = [
                {
                    "permit": index,
                    "key": permit_key,
                    "holder": None
                    if report.holder.owner is None
                    else {
                        "owner": report.holder.owner,
                        "task_id": report.holder.task_id,
                        "remaining": report.holder.remaining,
                        "nodes": report.votes,
                    },
                }
                for index, (permit_key, report) in enumerate(
                    zip(client.permit_keys(name, settings.limit), permits)
                )
            ]
        if rate is not None:
            out["rate"] = rate
        if queue is not None:
            out["queue"] = queue
        if problem:
            out["error"] = problem
        echo(json.dumps(out, indent=2))
    else:
        about = [
            ["Settings of:", label],
            ["Lock name:", name],
            ["Key:", key],
            ["Fence key:", fence_key],
            ["Nodes:", f"{len(lock.views)}, quorum {lock.quorum}"],
            ["Holder:", lock.describe()],
        ]
        if settings.limit > 1:
            held = sum(1 for report in permits if report.holder.owner is not None)
            about[-1] = ["Permits:", f"{held} of {settings.limit} held"]
        echo(table(about + rate_rows + queue_rows) + "\n")
        if settings.limit > 1:
            rows = [
                [
                    str(index),
                    report.summary(),
                    remaining_text(report),
                    report.nodes_text() if report.present or not report.known else "free",
                ]
                for index, report in enumerate(permits)
            ]
            echo(table(rows, ["PERMIT", "HOLDER", "TTL", "QUORUM"]) + "\n")
        rows = [[v.node, *view_cells(v), v.fence or "-"] for v in lock.views]
        echo(table(rows, ["NODE", "HOLDER", "TTL", "FENCE"]))
        lock.echo_down(echo)
    if problem:
        raise Unavailable(problem)
