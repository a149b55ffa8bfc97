"""``celery redlock list`` and ``release``: the lock, permit and claim keys, and
freeing the ones left stuck."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .. import conf, queues
from .._format import KeyReport, echo_down, glob_escape, ms_text, plural, ttl_text, view_cells
from .._reading import all_settings, connect, key_report
from ..core import STARTED_MARK, Redlock
from .base import LIMIT, LOCK, TASK, Unavailable, command, option
from .listing import Listing, remaining_text
from .targets import lock_target, plan_named

__all__ = ["list_", "release"]

# -- list --------------------------------------------------------------------


@command("list", TASK, LIMIT)
def list_(
    app: Any, echo: Callable, task: str | None, limit: int, timeout: float, **kwargs: Any
) -> None:
    """List the lock keys on the nodes (all, or only TASK's), with holders and TTLs.

    With lock_limit, a key's permits 1 .. K-1 are listed as "NAME permit I"
    beside its lock key (permit 0).

    One line per key with the quorum's view (a key is held when a majority of
    all configured nodes hold the same owner), then one line per node. Keys are
    found a page at a time (SCAN on Redis, never KEYS). Without TASK, every
    node set the app and its LockedTasks use is scanned.
    """
    if task:
        plan = plan_named(app, task)
        groups = [(f"task {task}", plan.resolved, glob_escape(plan.lock_name) + ":{*}")]
    else:
        groups = [(label, settings, "*") for label, settings in all_settings(app)]
    failed = []
    for index, (label, settings, tail) in enumerate(groups):
        if index:
            echo("")
        with connect(settings, timeout) as (client, _):
            listing = Listing(client, "lock", tail, limit)
            rows, held = [], 0
            for name in listing.names:
                lock = listing.read(f"lock:{name}", f"fence:{name}")
                rows.append([name, lock.summary(), remaining_text(lock), lock.nodes_text()])
                rows += [["    " + v.node, *view_cells(v), ""] for v in lock.views]
                held += lock.holder.owner is not None
            # Permits 1 .. K-1 of the keys with lock_limit K (permit 0 is the lock key).
            permits = Listing(client, "permit", tail + ":*" if task else "*", limit)
            permits.down = listing.down
            for name in permits.names:
                report = permits.read(f"permit:{name}")
                key_name, _, permit = name.rpartition(":")
                rows.append(
                    [
                        f"{key_name} permit {permit}",
                        report.summary(),
                        remaining_text(report),
                        report.nodes_text(),
                    ]
                )
                rows += [["    " + v.node, *view_cells(v), ""] for v in report.views]
                held += report.holder.owner is not None
            header = ["LOCK NAME / NODE", "HOLDER", "TTL", "QUORUM"]
            keys = len(listing.names) + len(permits.names)
            summary = f"{plural(keys, 'key')}, {held} held by a quorum."
            listing.truncated = listing.truncated or permits.truncated
            problem = listing.report(echo, f"Locks of {label}", header, rows, summary)
            claims = Listing(client, "claim", tail, limit)
            if claims.names:
                echo("")
                problem = problem or _list_claims(echo, claims, label, settings)
        if problem:
            failed.append(problem)
    if failed:
        raise Unavailable("; ".join(failed))


def _list_claims(
    echo: Callable, listing: Listing, label: str, settings: conf.LockSettings
) -> str | None:
    """The enqueue claims among the listed keys: task id, age, time left.

    A claim lives ``enqueue_ttl`` past its message's due time, so its age is
    read from its TTL: the time since the message was due ("due in ..." while
    its countdown runs). A claim whose run started shows that run's task id.
    """
    rows, pending = [], 0
    for name in listing.names:
        claim = listing.read(f"claim:{name}")
        value, remaining = claim.holder.owner, claim.holder.remaining
        if value is None:
            rows.append([name, "?", "-", "-", claim.nodes_text()])
            continue
        started = value.startswith(STARTED_MARK)
        pending += not started
        task_id = f"{value[len(STARTED_MARK) :]} (started)" if started else value
        age = "-" if remaining is None else _age_text(settings.enqueue_ttl - remaining)
        ttl = ttl_text(None if remaining is None else int(remaining * 1000))
        rows.append([name, task_id, age, ttl, claim.nodes_text()])
    header = ["CLAIM NAME", "TASK ID", "AGE", "TTL", "QUORUM"]
    summary = f"{plural(len(listing.names), 'claim')}, {pending} waiting for their run."
    return listing.report(echo, f"Enqueue claims of {label}", header, rows, summary)


def _age_text(seconds: float) -> str:
    return f"due in {ms_text(-seconds)}" if seconds < 0 else ms_text(seconds)


# -- release -----------------------------------------------------------------


@command(
    "release",
    *LOCK,
    option("Release Options", "-f", "--force", is_flag=True, help="Do not ask for confirmation."),
    option(
        "Release Options",
        "--task-id",
        help="Release only if the holder is this task id (no confirmation needed).",
    ),
    option(
        "Release Options",
        "--claim",
        is_flag=True,
        help="Withdraw the key's enqueue claim instead of its lock (owner-checked).",
    ),
)
def release(
    app: Any,
    echo: Callable,
    force: bool,
    task_id: str | None,
    claim: bool,
    timeout: float,
    **options: Any,
) -> None:
    """Free a stuck lock: delete its key on every node, whatever the holder.

    For an operator clearing a lock whose holder is dead or hung. If the
    holder is in fact still running, its next heartbeat finds the key gone,
    marks its lease lost (lock_lost signal, LockLost from check()), and a new
    execution may start meanwhile. Asks for confirmation unless --force.

    With --task-id, deletes the key only on the nodes where that task holds it
    (the same owner match the worker uses after a child died), and exits with
    1 if it holds it nowhere.

    With --claim, withdraws the key's enqueue claim instead (lock_enqueue): a
    claim left by a message that will never run keeps later calls from being
    queued until its TTL. Only the claim of the task id shown in the prompt
    (or given with --task-id) is withdrawn, never a newer one.

    The fence key is never touched: it remembers the largest fencing token
    granted, so the next holder's token is still larger than the stuck
    holder's and the protected resource keeps rejecting the stuck holder's late
    writes. (The nodes' clock floor would keep tokens growing anyway; the fence
    key does not depend on clocks.)
    """
    _, settings, name, _ = lock_target(app, **options)
    if claim:
        _release_claim(echo, settings, name, task_id, force, timeout)
        return
    with connect(settings, timeout) as (client, _):
        key, fence_key = client.keys(name)
        total = len(client.nodes)
        lock = key_report(client, key, fence_key)
        problem = lock.outage()
        if problem:
            lock.echo_down(echo)
            raise Unavailable(problem + "; nothing released")
        if task_id is not None:
            _release_task_id(echo, client, name, key, task_id, lock, settings.limit)
            return
        if not lock.owners:
            echo(f"Nothing to delete: {key} is free on every node that answered.")
            return
        if not force:
            click.confirm(
                f"Delete {key} on all {total} nodes?\n"
                f"Holder: {lock.describe()}\n"
                "If that holder is still running, another execution may start at once",
                abort=True,
            )
            # The lock may have changed hands while the operator read the prompt.
            if key_report(client, key, fence_key).owners - lock.owners:
                raise click.ClickException(
                    f"not deleted: {key} was taken by another holder meanwhile; run again"
                )
        deletions = client.force_release(name)
    _hand_over(app, echo, options.get("task"), name)
    errors = [(d.node, d.error) for d in deletions if d.error is not None]
    deleted = sum(1 for d in deletions if d.deleted)
    missing = total - deleted - len(errors)
    had_none = f" ({missing} had no such key)." if missing else "."
    echo(f"Deleted {key} on {deleted} of {total} nodes{had_none}")
    echo_down(echo, errors, ": its copy expires with its TTL.")
    if not client.has_quorum(total - len(errors)):
        raise Unavailable(f"only {total - len(errors)} of {total} nodes answered the delete")


def _hand_over(app: Any, echo: Callable, task: str | None, name: str) -> None:
    """A queued key (queue, supersede) freed: hand it to its next call at once. Its
    queue lives beside the lock key and is never deleted with it."""
    if not task:
        return
    plan = plan_named(app, task)
    if not plan.queued:
        return
    handed = queues.hand_over(plan, name)
    if handed is not None and handed.id is not None:
        echo(f"Handed the key to task {handed.id} ({handed.waiting} waiting, counting it).")


def _release_task_id(
    echo: Callable,
    client: Redlock,
    name: str,
    key: str,
    task_id: str,
    lock: KeyReport,
    limit: int = 1,
) -> None:
    """``release --task-id``: free the lock (with ``lock_limit``, the permit, whatever
    its index) only where that task holds it."""
    deleted = client.release_owned_by(name, task_id, limit)
    if deleted:
        echo(f"Released {key} on {deleted} of {len(client.nodes)} nodes (held by task {task_id}).")
    elif not lock.owners:
        echo(f"Nothing to release: {key} is free on every node that answered.")
    else:
        raise click.ClickException(
            f"not released: {key} is not held by task {task_id} (holder: {lock.describe()})"
        )


def _release_claim(
    echo: Callable,
    settings: conf.LockSettings,
    name: str,
    task_id: str | None,
    force: bool,
    timeout: float,
) -> None:
    """``release --claim``: withdraw the enqueue claim of ``name``, owner-checked."""
    with connect(settings, timeout) as (client, _):
        key = client.claim_key(name)
        current = key_report(client, key)
        problem = current.outage()
        if problem:
            current.echo_down(echo)
            raise Unavailable(problem + "; nothing withdrawn")
        claimant = current.holder.owner
        if task_id is None:
            if claimant is None or claimant.startswith(STARTED_MARK):
                echo(f"Nothing to withdraw: no task is claimed for {key}.")
                return
            if not force:
                click.confirm(
                    f"Withdraw the claim {key} of task {claimant}?\n"
                    "Later calls are queued again; that task still runs if its message exists",
                    abort=True,
                )
            task_id = claimant
        withdrawn = client.withdraw_claim(name, task_id)
    if not withdrawn:
        raise click.ClickException(
            f"not withdrawn: {key} is not claimed by task {task_id} (claim: {claimant or '-'})"
        )
    echo(f"Withdrew {key} of task {task_id} on {withdrawn} of {len(client.nodes)} nodes.")
