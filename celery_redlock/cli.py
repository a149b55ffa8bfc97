"""``celery -A proj redlock ...``: look at, and clear, the locks of a Celery app.

Installed through the ``celery.commands`` entry point, so every sub-command
runs with the app ``-A`` names::

    celery -A proj redlock nodes                      # health of the lock nodes
    celery -A proj redlock status proj.settle --args '[42]'
    celery -A proj redlock list [proj.settle]
    celery -A proj redlock release proj.settle --args '[42]' [--force | --task-id ID]
    celery -A proj redlock beat-slots [ENTRY]
    celery -A proj redlock settings [proj.settle]
    celery -A proj redlock web [--port 8089] [--actions --token T]   # a live dashboard

Output is plain text in aligned columns (``status --json`` for scripts).

Exit codes: 0 done; 1 bad input, a misconfiguration, or nothing done
(``release --task-id`` of a lock someone else holds); 2 fewer than a quorum of
the Redis nodes answered (and Click's own usage errors).

The commands open their own connections with ``--timeout`` (default 0.5 s)
per node and round instead of ``redlock_node_timeout``: an operator on another
network should see a slow node as slow, not as down. ``nodes`` flags a node
slower than ``redlock_node_timeout``, because the workers do count it as down.
Keys are found with ``SCAN`` (never ``KEYS``) and the listings stop at
``--limit`` keys per node.
"""

from __future__ import annotations

import functools
import json
import textwrap
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

import click
from celery.bin.base import (
    JSON_ARRAY,
    JSON_OBJECT,
    CeleryCommand,
    CeleryOption,
    handle_preload_options,
)
from redis.exceptions import RedisError

from . import conf, rates
from ._format import (
    KeyReport,
    echo_down,
    glob_escape,
    ms_text,
    nodes_text,
    outage,
    plural,
    printable,
    setting_text,
    slot_number,
    slot_time,
    table,
    ttl_text,
    view_cells,
)
from ._health import findings, node_row
from ._reading import OWNER, all_settings, connect, key_report, locked_plans
from .core import STARTED_MARK, Redlock
from .exceptions import ConfigurationError, LockKeyError, QuorumUnavailable, RedlockError

if TYPE_CHECKING:
    from .plan import LockPlan

__all__ = ["redlock"]

#: Default seconds per node and round for the CLI's own connections.
DEFAULT_TIMEOUT = 0.5
#: Exit code when fewer than a quorum of nodes answered.
EX_UNAVAILABLE = 2
#: Keys asked for per SCAN call.
SCAN_COUNT = 1000


class Unavailable(click.ClickException):
    """Fewer than a quorum of the Redis nodes answered, or Redis failed."""

    exit_code = EX_UNAVAILABLE


@click.group(name="redlock")
def redlock() -> None:
    """Inspect and clear celery_redlock locks and beat claims.

    Exit codes: 0 done, 1 bad input or nothing done, 2 fewer than a quorum of
    the Redis lock nodes answered.
    """


# -- options and the command decorator ----------------------------------------


def _option(group: str, *decls: str, **attrs: Any) -> Callable[..., Any]:
    return click.option(*decls, cls=CeleryOption, help_group=group, **attrs)


_TASK = click.argument("task", required=False)
_TIMEOUT = _option(
    "Connection Options",
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds each Redis node gets to answer one round.",
)
_LIMIT = _option(
    "Listing Options",
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Stop after this many keys per node.",
)
#: TASK with --args/--kwargs, or --name: which lock a command is about (see _lock_target).
_LOCK = (
    _TASK,
    _option(
        "Lock Options",
        "--args",
        "args_",
        type=JSON_ARRAY,
        help="The task's positional arguments as a JSON array.",
    ),
    _option(
        "Lock Options",
        "--kwargs",
        "kwargs_",
        type=JSON_OBJECT,
        help="The task's keyword arguments as a JSON object.",
    ),
    _option(
        "Lock Options",
        "--name",
        "lock_name",
        help="A lock name as the list command shows it (or its full Redis key), instead of "
        "TASK and its arguments. With TASK too, TASK only picks the nodes and prefix.",
    ),
)


def _command(name: str, *params: Callable[..., Any], timeout: bool = True) -> Callable[..., Any]:
    """A sub-command called as ``f(app, echo, **params)``, with --timeout unless told not.

    The library's and Redis's errors become one-line messages and exit codes.
    """

    def decorate(f: Callable[..., None]) -> click.Command:
        @functools.wraps(f)
        def run(ctx: click.Context, *args: Any, **kwargs: Any) -> None:
            try:
                f(ctx.obj.app, ctx.obj.echo, *args, **kwargs)
            except QuorumUnavailable as exc:
                raise Unavailable(f"Redis quorum unavailable: {exc}") from exc
            except ConfigurationError as exc:
                raise click.ClickException(f"configuration: {exc}") from exc
            except LockKeyError as exc:
                raise click.ClickException(f"cannot build the lock key: {exc}") from exc
            except RedlockError as exc:
                raise click.ClickException(str(exc)) from exc
            except RedisError as exc:  # not OSError: a closed stdout pipe is no Redis outage
                raise Unavailable(f"Redis error: {type(exc).__name__}: {exc}") from exc

        command = click.pass_context(handle_preload_options(run))
        for param in reversed((*params, _TIMEOUT) if timeout else params):
            command = param(command)
        return redlock.command(name=name, cls=CeleryCommand)(command)

    return decorate


# -- nodes -------------------------------------------------------------------


@_command("nodes", _TASK)
def nodes(app: Any, echo: Callable, task: str | None, timeout: float, **kwargs: Any) -> None:
    """Check every lock node: latency, version, role, eviction policy, persistence.

    Uses the app's redlock_* settings, or TASK's when given. Warns about what
    can break a lock: a maxmemory-policy other than noeviction (volatile-*
    policies evict exactly the keys with a TTL, that is every lock), a replica
    instead of a master, fewer replicas than redlock_min_replicas, two URLs
    reaching one server, no AOF. Exits with 2 when fewer than a quorum of the
    nodes answer.
    """
    label, settings = _target_settings(app, task)
    with connect(settings, timeout) as (client, notes):
        infos = client.node_info()
    quorum, total = client.quorum, len(client.nodes)
    echo(
        f"Lock nodes of {label} (prefix {settings.key_prefix!r}, quorum {quorum} of {total}, "
        f"redlock_node_timeout {ms_text(settings.node_timeout)})"
    )
    if total == 1:
        from_broker = conf.nodes_from_broker(app, app.tasks[task] if task else None)
        echo(nodes_text([node.name for node in client.nodes], quorum, from_broker))
    echo("")
    header = ["NODE", "PING", "VERSION", "ROLE", "MAXMEMORY-POLICY", "PERSISTENCE"]
    echo(table([node_row(info) for info in infos], header))
    lines = [f"WARNING {note}" for note in notes] + findings(
        infos, settings.node_timeout, settings.min_replicas
    )
    if lines:
        echo("\n" + "\n".join(lines))
    down = [(info.node, info.error) for info in infos if info.error is not None]
    answered = total - len(down)
    reachable = "reachable" if answered >= quorum else "UNREACHABLE"
    echo(f"\nQuorum: {reachable} ({answered} of {total} nodes answered, {quorum} needed)")
    problem = outage(down, total, quorum)
    if problem:
        raise Unavailable(problem)


# -- status ------------------------------------------------------------------


@_command(
    "status",
    *_LOCK,
    _option(
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
    TTL left (the node table is permit 0's, the lock key).

    The lock is TASK's for the arguments given with --args/--kwargs (the key
    is computed exactly as the worker computes it), or --name. TASK must be a
    LockedTask of the app.
    """
    label, settings, name = _lock_target(app, **options)
    with connect(settings, timeout) as (client, _):
        key, fence_key = client.keys(name)
        lock = key_report(client, key, fence_key)
        # With lock_limit K > 1: permit 0 is the lock key, read above; the others.
        permits = [lock] + [
            key_report(client, k, skip=dict(lock.down))
            for k in client.permit_keys(name, settings.limit)[1:]
        ]
        rate_rows, rate = rates.status(
            client, settings, name, options.get("args_"), options.get("kwargs_")
        )
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
        echo(table(about + rate_rows) + "\n")
        if settings.limit > 1:
            rows = [
                [
                    str(index),
                    report.summary(),
                    _remaining(report),
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


# -- list --------------------------------------------------------------------


@_command("list", _TASK, _LIMIT)
def list_(
    app: Any, echo: Callable, task: str | None, limit: int, timeout: float, **kwargs: Any
) -> None:
    """List the lock keys on the nodes (all, or only TASK's), with holders and TTLs.

    With lock_limit, a key's permits 1 .. K-1 are listed as "NAME permit I"
    beside its lock key (permit 0).

    One line per key with the quorum's view (a key is held when a majority of
    all configured nodes hold the same owner), then one line per node. Keys are
    found with SCAN, never KEYS. Without TASK, every node set the app and its
    LockedTasks use is scanned.
    """
    if task:
        plan = _plan(app, task)
        groups = [(f"task {task}", plan.resolved, glob_escape(plan.lock_name) + ":{*}")]
    else:
        groups = [(label, settings, "*") for label, settings in all_settings(app)]
    failed = []
    for index, (label, settings, tail) in enumerate(groups):
        if index:
            echo("")
        with connect(settings, timeout) as (client, _):
            listing = _Listing(client, "lock", tail, limit)
            rows, held = [], 0
            for name in listing.names:
                lock = listing.read(f"lock:{name}", f"fence:{name}")
                rows.append([name, lock.summary(), _remaining(lock), lock.nodes_text()])
                rows += [["    " + v.node, *view_cells(v), ""] for v in lock.views]
                held += lock.holder.owner is not None
            # Permits 1 .. K-1 of the keys with lock_limit K (permit 0 is the lock key).
            permits = _Listing(client, "permit", tail + ":*" if task else "*", limit)
            permits.down = listing.down
            for name in permits.names:
                report = permits.read(f"permit:{name}")
                key_name, _, permit = name.rpartition(":")
                rows.append(
                    [
                        f"{key_name} permit {permit}",
                        report.summary(),
                        _remaining(report),
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
            claims = _Listing(client, "claim", tail, limit)
            if claims.names:
                echo("")
                problem = problem or _list_claims(echo, claims, label, settings)
        if problem:
            failed.append(problem)
    if failed:
        raise Unavailable("; ".join(failed))


def _list_claims(
    echo: Callable, listing: _Listing, label: str, settings: conf.LockSettings
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


@_command(
    "release",
    *_LOCK,
    _option("Release Options", "-f", "--force", is_flag=True, help="Do not ask for confirmation."),
    _option(
        "Release Options",
        "--task-id",
        help="Release only if the holder is this task id (no confirmation needed).",
    ),
    _option(
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
    _, settings, name = _lock_target(app, **options)
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
    errors = [(d.node, d.error) for d in deletions if d.error is not None]
    deleted = sum(1 for d in deletions if d.deleted)
    missing = total - deleted - len(errors)
    had_none = f" ({missing} had no such key)." if missing else "."
    echo(f"Deleted {key} on {deleted} of {total} nodes{had_none}")
    echo_down(echo, errors, ": its copy expires with its TTL.")
    if not client.has_quorum(total - len(errors)):
        raise Unavailable(f"only {total - len(errors)} of {total} nodes answered the delete")


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


# -- beat-slots --------------------------------------------------------------


@_command("beat-slots", click.argument("entry", required=False), _LIMIT)
def beat_slots(
    app: Any, echo: Callable, entry: str | None, limit: int, timeout: float, **kwargs: Any
) -> None:
    """List the beat slot claims ({prefix}:beat:{entry}:{slot}), newest first.

    Each claim says one beat sent that entry's slot. The slot is shown in
    epoch seconds and as UTC time; the claim value (who sent it, the message
    id) is printed as stored.
    """
    with connect(conf.resolve(app, owner=OWNER), timeout) as (client, _):
        tail = glob_escape(entry) + ":*" if entry else "*"
        listing = _Listing(client, "beat", tail, limit)
        slots = []
        for name in listing.names:
            entry_name, _, slot = name.rpartition(":")
            if entry is None or entry_name == entry:  # "a:*" also matches entry "a:b"
                slots.append((entry_name, slot, listing.read(f"beat:{name}").views))
        slots.sort(key=lambda s: (s[0], -slot_number(s[1])))
        rows = []
        for entry_name, slot, views in slots:
            # No values when the claim expired between SCAN and the read.
            values = Counter(v.holder for v in views if v.holder is not None)
            for value, votes in values.most_common():
                ttl = ttl_text(min(v.pttl_ms for v in views if v.holder == value))
                nodes = f"{votes}/{len(views)}"
                rows.append([entry_name, slot, slot_time(slot), nodes, ttl, printable(value)])
        header = ["ENTRY", "SLOT", "TIME (UTC)", "NODES", "TTL", "CLAIM"]
        problem = listing.report(
            echo, "Beat claims", header, rows, f"{plural(len(slots), 'claim')}."
        )
    if problem:
        raise Unavailable(problem)


# -- settings ----------------------------------------------------------------


@_command("settings", _TASK, timeout=False)
def settings_(app: Any, echo: Callable, task: str | None, **kwargs: Any) -> None:
    """Print every redlock_* setting: resolved value, where it comes from, meaning.

    With TASK, the values that task uses (its lock_* attributes win over
    app.conf). Passwords in node URLs are masked.
    """
    resolved: conf.LockSettings | None = None
    problem = None
    if task:
        resolved = _plan(app, task).resolved
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


# -- helpers: app, tasks, settings -------------------------------------------


def _plan(app: Any, task: str) -> LockPlan:
    plans = locked_plans(app)
    if task in plans:
        return plans[task]
    what = "is not a LockedTask" if task in app.tasks else "is not a task registered in the app"
    known = ", ".join(plans) or "none"
    raise click.ClickException(f"{task!r} {what}. The app's LockedTasks: {known}")


def _target_settings(app: Any, task: str | None) -> tuple[str, conf.LockSettings]:
    if task:
        return f"task {task}", _plan(app, task).resolved
    return "the app", conf.resolve(app, owner=OWNER)


def _lock_target(
    app: Any,
    task: str | None,
    args_: list | None,
    kwargs_: dict | None,
    lock_name: str | None,
    **preload_options: Any,
) -> tuple[str, conf.LockSettings, str]:
    """(label, settings, lock name) of the one lock a command is about."""
    if not lock_name:
        if not task:
            raise click.UsageError(
                "name a lock: TASK [--args JSON] [--kwargs JSON], or --name LOCK"
            )
        plan = _plan(app, task)
        return f"task {task}", plan.resolved, plan.keys.build(args_ or [], kwargs_ or {})
    if args_ is not None or kwargs_ is not None:
        raise click.UsageError("--name takes no --args/--kwargs: the name already includes them")
    label, settings = _target_settings(app, task)
    # Accept the Redis key itself, as redis-cli shows it.
    full = f"{settings.key_prefix}:lock:"
    return label, settings, lock_name[len(full) :] if lock_name.startswith(full) else lock_name


# -- helpers: reading keys ---------------------------------------------------


def _remaining(report: KeyReport) -> str:
    """The TTL left on the key of the holder a quorum agrees on, for a table cell."""
    remaining = report.holder.remaining
    return ttl_text(None if remaining is None else int(remaining * 1000))


class _Listing:
    """The ``{prefix}:{kind}:`` keys matching ``tail`` on every node (SCAN), at most ``limit``."""

    def __init__(self, client: Redlock, kind: str, tail: str, limit: int):
        self.client, self.limit = client, limit
        self.pattern = glob_escape(f"{client.key_prefix}:{kind}:") + tail
        found = client.scan(kind, tail, limit=limit, count=SCAN_COUNT)
        self.names, self.truncated = found.names, found.truncated
        #: Node name -> error of the nodes that failed; not asked again.
        self.down = dict(found.errors)

    def read(self, key: str, fence_key: str | None = None) -> KeyReport:
        """``{prefix}:{key}`` (and ``{prefix}:{fence_key}``) on the nodes still answering."""
        prefix = self.client.key_prefix
        fence = f"{prefix}:{fence_key}" if fence_key else None
        report = key_report(self.client, f"{prefix}:{key}", fence, skip=self.down)
        for name, error in report.down:  # a node that fails now is skipped from now on
            self.down.setdefault(name, error)
        return report

    def report(
        self, echo: Callable, title: str, header: list[str], rows: list[list[str]], summary: str
    ) -> str | None:
        """Print the listing; the error text if fewer than a quorum of nodes answered."""
        client = self.client
        echo(f"{title}: {len(client.nodes)} nodes, quorum {client.quorum}, keys {self.pattern}\n")
        if rows:
            echo(table(rows, header) + "\n")
        if self.truncated:
            summary += f" Stopped at --limit {self.limit}: more keys may exist."
        echo(summary)
        down = [
            (node.name, self.down[node.name]) for node in client.nodes if node.name in self.down
        ]
        echo_down(echo, down)
        return outage(down, len(client.nodes), client.quorum)


# -- web ---------------------------------------------------------------------


@_command(
    "web",
    _option(
        "Web Options",
        "--port",
        type=click.IntRange(min=0, max=65535),
        default=8089,
        show_default=True,
        help="The TCP port to listen on (0: any free port).",
    ),
    _option(
        "Web Options",
        "--bind",
        default="127.0.0.1",
        show_default=True,
        help="The address to listen on; the default keeps the page on this machine.",
    ),
    _option(
        "Web Options",
        "--actions",
        is_flag=True,
        help="Offer release and withdraw on the page (needs --token or --basic-auth).",
    ),
    _option(
        "Web Options",
        "--token",
        envvar="CELERY_REDLOCK_WEB_TOKEN",
        help="Require this token to log in (or as Authorization: Bearer); "
        "also read from CELERY_REDLOCK_WEB_TOKEN.",
    ),
    _option(
        "Web Options",
        "--basic-auth",
        envvar="CELERY_REDLOCK_WEB_BASIC_AUTH",
        help="Require HTTP basic authentication as USER:PASSWORD; "
        "also read from CELERY_REDLOCK_WEB_BASIC_AUTH.",
    ),
    _option(
        "Web Options",
        "--refresh",
        type=click.FloatRange(min=0.5),
        default=1.5,
        show_default=True,
        help="Seconds between the page's reads.",
    ),
)
def web(
    app: Any,
    echo: Callable,
    port: int,
    bind: str,
    actions: bool,
    token: str | None,
    basic_auth: str | None,
    refresh: float,
    timeout: float,
    **kwargs: Any,
) -> None:
    """Serve a live dashboard of the locks, permits, claims, schedules and nodes.

    Read-only unless --actions, which offers release (a lock or a permit) and
    withdraw (a claim), owner-checked and confirmed one key at a time, and
    which needs --token or --basic-auth. Binds 127.0.0.1 unless --bind says
    otherwise; put it behind TLS before binding anything else.
    """
    from .web import make_app, server

    if token and basic_auth:
        raise click.UsageError("give --token or --basic-auth, not both")
    auth: Any = token or None
    if basic_auth:
        user, sep, password = basic_auth.partition(":")
        if not (sep and user and password):
            raise click.UsageError("--basic-auth takes USER:PASSWORD")
        auth = (user, password)
    dashboard = make_app(app, actions=actions, auth=auth, timeout=timeout, refresh=refresh)
    httpd = server(dashboard, bind, port)
    host, bound = httpd.server_address[:2]
    mode = "actions on" if actions else "read-only"
    echo(f"celery redlock dashboard on http://{host!s}:{bound}/ ({mode}); Ctrl-C stops it")
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        dashboard.close()
