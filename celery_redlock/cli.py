"""``celery -A proj redlock ...``: look at, and clear, the locks of a Celery app.

Installed through the ``celery.commands`` entry point, so every sub-command
runs with the app ``-A`` names::

    celery -A proj redlock nodes                      # health of the lock nodes
    celery -A proj redlock status proj.settle --args '[42]'
    celery -A proj redlock list [proj.settle]
    celery -A proj redlock release proj.settle --args '[42]' [--force | --task-id ID]
    celery -A proj redlock beat-slots [ENTRY]
    celery -A proj redlock settings [proj.settle]

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
import re
import textwrap
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import click
from celery.bin.base import (
    JSON_ARRAY,
    JSON_OBJECT,
    CeleryCommand,
    CeleryOption,
    handle_preload_options,
)
from redis.exceptions import RedisError

from . import conf
from ._nodes import Node, _describe, gather, run_script
from ._scripts import Script
from .exceptions import ConfigurationError, LockKeyError, QuorumUnavailable, RedlockError
from .redlock import OWNER_SEP, Redlock
from .task import LockedTask, LockPlan

__all__ = ["redlock"]

#: Named in configuration errors raised while resolving the app-level settings.
OWNER = "celery redlock"
#: Default seconds per node and round for the CLI's own connections.
DEFAULT_TIMEOUT = 0.5
#: Exit code when fewer than a quorum of nodes answered.
EX_UNAVAILABLE = 2
#: Keys asked for per SCAN call.
SCAN_COUNT = 1000

# KEYS[1] any key. Returns {value or false, PTTL in ms}. One round per key for
# every node at once, instead of a GET round and a PTTL round.
_PEEK = Script(
    "cli-peek",
    """
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
""",
)

#: ``maxmemory-policy`` values that never evict a key. ``volatile-*`` policies
#: evict keys with a TTL, which is every lock; ``allkeys-*`` evict anything.
_SAFE_POLICIES = ("noeviction",)


class Unavailable(click.ClickException):
    """Fewer than a quorum of the Redis nodes answered, or Redis failed."""

    exit_code = EX_UNAVAILABLE


# -- the group ---------------------------------------------------------------


@click.group(name="redlock")
def redlock() -> None:
    """Inspect and clear celery_redlock locks and beat claims.

    Exit codes: 0 done, 1 bad input or nothing done, 2 fewer than a quorum of
    the Redis lock nodes answered.
    """


def _timeout_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--timeout",
        cls=CeleryOption,
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULT_TIMEOUT,
        show_default=True,
        help_group="Connection Options",
        help="Seconds each Redis node gets to answer one round.",
    )(f)


def _lock_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """TASK with --args/--kwargs, or --name: which lock a command is about."""
    options = [
        click.argument("task", required=False),
        click.option(
            "--args",
            "args_",
            cls=CeleryOption,
            type=JSON_ARRAY,
            default=None,
            help_group="Lock Options",
            help="The task's positional arguments as a JSON array.",
        ),
        click.option(
            "--kwargs",
            "kwargs_",
            cls=CeleryOption,
            type=JSON_OBJECT,
            default=None,
            help_group="Lock Options",
            help="The task's keyword arguments as a JSON object.",
        ),
        click.option(
            "--name",
            "lock_name",
            cls=CeleryOption,
            default=None,
            help_group="Lock Options",
            help="A lock name as `list` shows it (or its full Redis key), instead of "
            "TASK and its arguments. With TASK too, TASK only picks the nodes and prefix.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _reports_errors(f: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the library's and Redis's errors into one-line messages and exit codes."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
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

    return wrapper


# -- nodes -------------------------------------------------------------------


@redlock.command(cls=CeleryCommand)
@click.argument("task", required=False)
@_timeout_option
@click.pass_context
@handle_preload_options
@_reports_errors
def nodes(ctx: click.Context, task: str | None, timeout: float, **kwargs: Any) -> None:
    """Check every lock node: latency, version, role, eviction policy, persistence.

    Uses the app's redlock_* settings, or TASK's when given. Warns about what
    can break a lock: a maxmemory-policy other than noeviction (volatile-*
    policies evict exactly the keys with a TTL, that is every lock), a replica
    instead of a master, two URLs reaching one server, no AOF. Exits with 2
    when fewer than a quorum of the nodes answer.
    """
    app = _app(ctx)
    label, settings = _target_settings(app, task)
    with _connect(settings, timeout) as (client, notes):
        probes = [_probe(node, timeout) for node in client.nodes]
        quorum, total = client.quorum, len(client.nodes)
    echo = ctx.obj.echo
    echo(
        f"Lock nodes of {label} (prefix {settings.key_prefix!r}, quorum {quorum} of {total}, "
        f"redlock_node_timeout {_ms_text(settings.node_timeout)})"
    )
    echo("")
    rows = [
        [
            p.name,
            _ms_text(p.latency) if p.error is None else "DOWN",
            p.version,
            p.role,
            p.policy if p.error or p.policy in _SAFE_POLICIES else f"{p.policy} (UNSAFE)",
            p.persistence,
        ]
        for p in probes
    ]
    for line in _table(
        ["NODE", "PING", "VERSION", "ROLE", "MAXMEMORY-POLICY", "PERSISTENCE"], rows
    ):
        echo(line)
    findings = [f"WARNING {note}" for note in notes] + _findings(probes, settings.node_timeout)
    if findings:
        echo("")
        for line in findings:
            echo(line)
    down = [p for p in probes if p.error is not None]
    answered = total - len(down)
    echo("")
    if answered >= quorum:
        echo(f"Quorum: reachable ({answered} of {total} nodes answered, {quorum} needed)")
        return
    echo(f"Quorum: UNREACHABLE ({answered} of {total} nodes answered, {quorum} needed)")
    raise Unavailable(
        f"only {answered} of {total} Redis nodes answered, {quorum} needed; down: "
        + "; ".join(f"{p.name} ({p.error})" for p in down)
    )


@dataclass
class _Probe:
    """What one node told ``nodes``."""

    name: str
    error: str | None = None
    latency: float = 0.0
    version: str = "-"
    role: str = "-"
    policy: str = "-"
    maxmemory: int = 0
    aof: bool | None = None
    fsync: str | None = None
    run_id: str | None = None

    @property
    def persistence(self) -> str:
        if self.aof is None:
            return "-"
        if not self.aof:
            return "aof off"
        return f"aof, fsync {self.fsync or '?'}"


def _probe(node: Node, timeout: float) -> _Probe:
    # One node at a time, so the PING latency is this node's alone.
    probe = _Probe(node.name)
    for _ in range(2):  # time the second: the first pays for connecting
        started = time.perf_counter()
        pong = gather([node], ("PING",), timeout)[0]
        probe.latency = time.perf_counter() - started
        if isinstance(pong, Exception):
            probe.error = _error_text(pong)
            return probe
    info = gather([node], ("INFO",), timeout)[0]
    if isinstance(info, Exception):
        probe.error = f"INFO failed: {_error_text(info)}"
        return probe
    fields = _parse_info(info)
    version = fields.get("redis_version", "?")
    if "valkey_version" in fields:
        version = f"valkey {fields['valkey_version']}"
    probe.version = version
    probe.role = fields.get("role", "?")
    probe.policy = fields.get("maxmemory_policy", "?")
    probe.maxmemory = int(fields.get("maxmemory", "0") or 0)
    probe.aof = fields.get("aof_enabled") == "1" if "aof_enabled" in fields else None
    probe.run_id = fields.get("run_id")
    if probe.aof:
        # CONFIG may be renamed or denied (managed Redis): then the policy shows as "?".
        reply = gather([node], ("CONFIG", "GET", "appendfsync"), timeout)[0]
        if isinstance(reply, list) and len(reply) == 2:
            probe.fsync = _text(reply[1])
    return probe


def _parse_info(raw: Any) -> dict[str, str]:
    fields = {}
    for line in _text(raw).splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _findings(probes: Sequence[_Probe], node_timeout: float) -> list[str]:
    """The DOWN, WARNING and note lines of ``nodes``; one line per finding, naming its nodes."""
    found: dict[tuple[str, str], list[str]] = {}  # (level, message) -> node names, in order

    def add(level: str, node: str, message: str) -> None:
        found.setdefault((level, message), []).append(node)

    seen_run_ids: dict[str, str] = {}
    for p in probes:
        if p.error is not None:
            add("DOWN", p.name, p.error)
            continue
        if p.policy not in _SAFE_POLICIES:
            why = (
                "evicts keys with a TTL, which is every lock"
                if p.policy.startswith("volatile-")
                else "may evict any key, locks included"
            )
            limit = "" if p.maxmemory else " (maxmemory is 0 now: it starts once a limit is set)"
            add(
                "WARNING",
                p.name,
                f"maxmemory-policy {p.policy} {why}: a held lock can vanish under memory "
                f"pressure and a second execution start{limit}. Set maxmemory-policy noeviction.",
            )
        if p.role not in ("master", "?"):
            add(
                "WARNING",
                p.name,
                f"role {p.role}: lock nodes must be independent masters (a replica refuses "
                "writes; a failover to one loses recent locks).",
            )
        if p.run_id:
            other = seen_run_ids.setdefault(p.run_id, p.name)
            if other != p.name:
                add(
                    "WARNING",
                    p.name,
                    f"same server as {other} (run_id {p.run_id}): one server counted twice "
                    "breaks the quorum arithmetic.",
                )
        if p.latency > node_timeout:
            add(
                "WARNING",
                p.name,
                f"answers in {_ms_text(p.latency)}, slower than redlock_node_timeout "
                f"({_ms_text(node_timeout)}): the workers count it as down.",
            )
        if p.aof is False:
            add(
                "note",
                p.name,
                "no AOF: a restart forgets the locks a node held; keep a restarted node out "
                "for longer than the longest lock TTL, or run appendonly yes.",
            )
        elif p.aof and p.fsync not in ("always", None):
            add(
                "note",
                p.name,
                f"appendfsync {p.fsync}: a crash may lose the last writes (up to about a "
                "second); appendfsync always closes that window.",
            )
    order = {"DOWN": 0, "WARNING": 1, "note": 2}
    return [
        f"{level:<7} {', '.join(names)}: {message}"
        for (level, message), names in sorted(found.items(), key=lambda item: order[item[0][0]])
    ]


# -- status ------------------------------------------------------------------


@redlock.command(cls=CeleryCommand)
@_lock_options
@click.option(
    "--json",
    "as_json",
    cls=CeleryOption,
    is_flag=True,
    help_group="Output Options",
    help="Print one JSON object instead of text.",
)
@_timeout_option
@click.pass_context
@handle_preload_options
@_reports_errors
def status(
    ctx: click.Context,
    task: str | None,
    args_: list | None,
    kwargs_: dict | None,
    lock_name: str | None,
    as_json: bool,
    timeout: float,
    **kwargs: Any,
) -> None:
    """Show who holds one lock: the quorum's view and every node's.

    The lock is TASK's for the arguments given with --args/--kwargs (the key
    is computed exactly as the worker computes it), or --name. TASK must be a
    LockedTask of the app.
    """
    app = _app(ctx)
    label, settings, name = _lock_target(app, task, args_, kwargs_, lock_name)
    with _connect(settings, timeout) as (client, _):
        key, fence_key = client.keys(name)
        views = _inspect(client, name)
        quorum = client.quorum
    view = _QuorumView.of(views, quorum)
    answered = sum(1 for v in views if v.error is None)
    problem = None
    if answered < quorum:
        problem = _unavailable_text(views, quorum)
    if as_json:
        ctx.obj.echo(
            json.dumps(
                _status_json(label, name, key, fence_key, quorum, views, view, problem), indent=2
            )
        )
    else:
        _print_status(ctx, label, name, key, fence_key, quorum, views, view)
    if problem:
        raise Unavailable(problem)


def _print_status(
    ctx: click.Context,
    label: str,
    name: str,
    key: str,
    fence_key: str,
    quorum: int,
    views: Sequence[_NodeView],
    view: _QuorumView,
) -> None:
    echo = ctx.obj.echo
    for line in _table(
        ["", ""],
        [
            ["Settings of:", label],
            ["Lock name:", name],
            ["Key:", key],
            ["Fence key:", fence_key],
            ["Nodes:", f"{len(views)}, quorum {quorum}"],
            ["Holder:", view.describe()],
        ],
        show_header=False,
    ):
        echo(line)
    echo("")
    rows = [
        [
            v.node,
            "DOWN" if v.error else (v.value or "-"),
            "-" if v.error else _ttl_text(v.pttl_ms),
            v.fence or "-",
        ]
        for v in views
    ]
    for line in _table(["NODE", "HOLDER", "TTL", "FENCE"], rows):
        echo(line)
    _echo_errors(ctx, views)


def _status_json(
    label: str,
    name: str,
    key: str,
    fence_key: str,
    quorum: int,
    views: Sequence[_NodeView],
    view: _QuorumView,
    problem: str | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "settings_of": label,
        "name": name,
        "key": key,
        "fence_key": fence_key,
        "quorum": quorum,
        "nodes_total": len(views),
        "answered": sum(1 for v in views if v.error is None),
        "held": view.owner is not None,
        "holder": None,
        "nodes": [v.as_json() for v in views],
    }
    if view.owner is not None:
        out["holder"] = {
            "owner": view.owner,
            "task_id": _task_id(view.owner),
            "remaining": view.remaining,
            "nodes": view.votes,
        }
    if problem:
        out["error"] = problem
    return out


# -- list --------------------------------------------------------------------


@redlock.command(name="list", cls=CeleryCommand)
@click.argument("task", required=False)
@click.option(
    "--limit",
    cls=CeleryOption,
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help_group="Listing Options",
    help="Stop after this many keys per node.",
)
@_timeout_option
@click.pass_context
@handle_preload_options
@_reports_errors
def list_(ctx: click.Context, task: str | None, limit: int, timeout: float, **kwargs: Any) -> None:
    """List the lock keys on the nodes (all, or only TASK's), with holders and TTLs.

    One line per key with the quorum's view (a key is held when a majority of
    all configured nodes hold the same owner), then one line per node. Keys are
    found with SCAN, never KEYS. Without TASK, every node set the app and its
    LockedTasks use is scanned.
    """
    app = _app(ctx)
    if task:
        locked = _locked_task(app, task)
        plan = _plan(locked)
        groups = [(f"task {locked.name}", plan.settings, _glob_escape(plan.lock_name) + ":{*}")]
    else:
        groups = [(label, settings, "*") for label, settings in _all_settings(app)]
    failed = []
    for index, (label, settings, tail) in enumerate(groups):
        if index:
            ctx.obj.echo("")
        with _connect(settings, timeout) as (client, _):
            problem = _list_group(ctx, client, label, tail, limit, timeout)
        if problem:
            failed.append(problem)
    if failed:
        raise Unavailable("; ".join(failed))


def _list_group(
    ctx: click.Context, client: Redlock, label: str, tail: str, limit: int, timeout: float
) -> str | None:
    """List one node set's lock keys; returns an error text if the quorum did not answer."""
    echo = ctx.obj.echo
    base = f"{client.key_prefix}:lock:"
    pattern = _glob_escape(base) + tail
    keys, truncated, down = _scan_all(client, pattern, limit, timeout)
    echo(f"Locks of {label}: {len(client.nodes)} nodes, quorum {client.quorum}, keys {pattern}")
    echo("")
    rows, held = [], 0
    for raw_key in keys:
        views = _peek(client, raw_key, timeout, down)
        view = _QuorumView.of(views, client.quorum)
        held += view.owner is not None
        rows.append(
            [
                _text(raw_key)[len(base) :],
                view.summary(),
                _ttl_text(None if view.remaining is None else int(view.remaining * 1000)),
                view.nodes_text(),
            ]
        )
        for v in views:
            rows.append(
                [
                    "    " + v.node,
                    "DOWN" if v.error else (v.value or "-"),
                    "-" if v.error else _ttl_text(v.pttl_ms),
                    "",
                ]
            )
    if rows:
        for line in _table(["LOCK NAME / NODE", "HOLDER", "TTL", "QUORUM"], rows):
            echo(line)
        echo("")
    echo(
        f"{len(keys)} key{'' if len(keys) == 1 else 's'}, {held} held by a quorum."
        + (f" Stopped at --limit {limit}: more keys may exist." if truncated else "")
    )
    return _down_problems(ctx, client, down)


# -- release -----------------------------------------------------------------


@redlock.command(cls=CeleryCommand)
@_lock_options
@click.option(
    "-f",
    "--force",
    cls=CeleryOption,
    is_flag=True,
    help_group="Release Options",
    help="Do not ask for confirmation.",
)
@click.option(
    "--task-id",
    cls=CeleryOption,
    default=None,
    help_group="Release Options",
    help="Release only if the holder is this task id (no confirmation needed).",
)
@_timeout_option
@click.pass_context
@handle_preload_options
@_reports_errors
def release(
    ctx: click.Context,
    task: str | None,
    args_: list | None,
    kwargs_: dict | None,
    lock_name: str | None,
    force: bool,
    task_id: str | None,
    timeout: float,
    **kwargs: Any,
) -> None:
    """Free a stuck lock: delete its key on every node, whatever the holder.

    For an operator clearing a lock whose holder is dead or hung. If the
    holder is in fact still running, its next heartbeat finds the key gone,
    marks its lease lost (lock_lost signal, LockLost from check()), and a new
    execution may start meanwhile. Asks for confirmation unless --force.

    With --task-id, deletes the key only on the nodes where that task holds it
    (the same owner match the worker uses after a child died), and exits with
    1 if it holds it nowhere.

    The fence key is never touched: it remembers the largest fencing token
    granted, so the next holder's token is still larger than the stuck
    holder's and the protected resource keeps rejecting the stuck holder's late
    writes. (The nodes' clock floor would keep tokens growing anyway; the fence
    key does not depend on clocks.)
    """
    app = _app(ctx)
    echo = ctx.obj.echo
    label, settings, name = _lock_target(app, task, args_, kwargs_, lock_name)
    with _connect(settings, timeout) as (client, _):
        key, _fence = client.keys(name)
        views = _inspect(client, name)
        quorum, total = client.quorum, len(client.nodes)
        if sum(1 for v in views if v.error is None) < quorum:
            _echo_errors(ctx, views)
            raise Unavailable(_unavailable_text(views, quorum) + "; nothing released")
        view = _QuorumView.of(views, quorum)
        holders = {v.value for v in views if v.value}
        if task_id is not None:
            deleted = client.release_owned_by(name, task_id)
            if deleted:
                echo(f"Released {key} on {deleted} of {total} nodes (held by task {task_id}).")
                return
            if not holders:
                echo(f"Nothing to release: {key} is free on every node that answered.")
                return
            raise click.ClickException(
                f"not released: {key} is not held by task {task_id} (holder: {view.describe()})"
            )
        if not holders:
            echo(f"Nothing to delete: {key} is free on every node that answered.")
            return
        if not force:
            click.confirm(
                f"Delete {key} on all {total} nodes?\n"
                f"Holder: {view.describe()}\n"
                "If that holder is still running, another execution may start at once",
                abort=True,
            )
            # The lock may have changed hands while the operator read the prompt.
            again = _inspect(client, name)
            if {v.value for v in again if v.value} - holders:
                raise click.ClickException(
                    f"not deleted: {key} was taken by another holder meanwhile; run again"
                )
        replies = gather(client.nodes, ("DEL", key), timeout)
    errors = [(n.name, r) for n, r in zip(client.nodes, replies) if isinstance(r, Exception)]
    deleted = sum(1 for r in replies if r == 1)
    missing = total - deleted - len(errors)
    echo(
        f"Deleted {key} on {deleted} of {total} nodes"
        + (f" ({missing} had no such key)." if missing else ".")
    )
    for node_name, error in errors:
        echo(f"DOWN    {node_name}: {_error_text(error)}: its copy expires with its TTL.")
    if total - len(errors) < quorum:
        raise Unavailable(f"only {total - len(errors)} of {total} nodes answered the delete")


# -- beat-slots --------------------------------------------------------------


@redlock.command(name="beat-slots", cls=CeleryCommand)
@click.argument("entry", required=False)
@click.option(
    "--limit",
    cls=CeleryOption,
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help_group="Listing Options",
    help="Stop after this many keys per node.",
)
@_timeout_option
@click.pass_context
@handle_preload_options
@_reports_errors
def beat_slots(
    ctx: click.Context, entry: str | None, limit: int, timeout: float, **kwargs: Any
) -> None:
    """List the beat slot claims ({prefix}:beat:{entry}:{slot}), newest first.

    Each claim says one beat sent that entry's slot. The slot is shown in
    epoch seconds and as UTC time; the claim value (who sent it, the message
    id) is printed as stored.
    """
    app = _app(ctx)
    echo = ctx.obj.echo
    settings = conf.resolve(app, owner=OWNER)
    with _connect(settings, timeout) as (client, _):
        base = f"{client.key_prefix}:beat:"
        pattern = _glob_escape(base) + (_glob_escape(entry) + ":*" if entry else "*")
        keys, truncated, down = _scan_all(client, pattern, limit, timeout)
        echo(f"Beat claims: {len(client.nodes)} nodes, quorum {client.quorum}, keys {pattern}")
        echo("")
        slots = []
        for raw_key in keys:
            entry_name, _, slot = _text(raw_key)[len(base) :].rpartition(":")
            if entry is not None and entry_name != entry:
                continue  # "a:*" also matches entry "a:b"
            slots.append((entry_name, slot, _peek(client, raw_key, timeout, down)))
        slots.sort(key=lambda s: (s[0], -_slot_number(s[1])))
        rows = []
        for entry_name, slot, views in slots:
            values = Counter(v.value for v in views if v.value is not None)
            if not values:
                continue  # expired between SCAN and GET
            for value, votes in values.most_common():
                pttls = [v.pttl_ms for v in views if v.value == value and v.pttl_ms is not None]
                rows.append(
                    [
                        entry_name,
                        slot,
                        _slot_time(slot),
                        f"{votes}/{len(views)}",
                        _ttl_text(min(pttls) if pttls else None),
                        _printable(value),
                    ]
                )
        if rows:
            for line in _table(["ENTRY", "SLOT", "TIME (UTC)", "NODES", "TTL", "CLAIM"], rows):
                echo(line)
            echo("")
        echo(
            f"{len(slots)} claim{'' if len(slots) == 1 else 's'}."
            + (f" Stopped at --limit {limit}: more keys may exist." if truncated else "")
        )
        problem = _down_problems(ctx, client, down)
    if problem:
        raise Unavailable(problem)


# -- settings ----------------------------------------------------------------


@redlock.command(name="settings", cls=CeleryCommand)
@click.argument("task", required=False)
@click.pass_context
@handle_preload_options
@_reports_errors
def settings_(ctx: click.Context, task: str | None, **kwargs: Any) -> None:
    """Print every redlock_* setting: resolved value, where it comes from, meaning.

    With TASK, the values that task uses (its lock_* attributes win over
    app.conf). Passwords in node URLs are masked.
    """
    app = _app(ctx)
    echo = ctx.obj.echo
    locked = _locked_task(app, task) if task else None
    overrides = (
        {s.task_attr: getattr(locked, s.task_attr, None) for s in conf.SETTINGS} if locked else {}
    )
    resolved: conf.LockSettings | None = None
    problem = None
    if locked is not None:
        resolved = _plan(locked).settings
    else:
        try:
            resolved = conf.resolve(app, owner=OWNER)
        except ConfigurationError as exc:
            problem = str(exc)
    rows, docs = [], []
    for setting in conf.SETTINGS:
        field = setting.name[len("redlock_") :]
        if overrides.get(setting.task_attr) is not None:
            value, source = overrides[setting.task_attr], f"task.{setting.task_attr}"
        elif app.conf.get(setting.name) is not None:
            value, source = app.conf.get(setting.name), "app.conf"
        else:
            value, source = setting.default, "default"
        # Settings that LockSettings does not carry (beat's, say) show as configured.
        if resolved is not None and hasattr(resolved, field):
            if value is None:  # filled in by resolve()
                source = {"nodes": "broker_url", "heartbeat_interval": "ttl / 3"}.get(
                    field, "derived"
                )
            value = getattr(resolved, field)
        rows.append([setting.name, source, _setting_text(value)])
        docs.append(setting.doc)
    echo(f"Settings of {f'task {locked.name}' if locked else 'the app'}")
    echo("")
    lines = _table(["SETTING", "FROM", "VALUE"], rows)
    echo(lines[0])
    for line, doc in zip(lines[1:], docs):
        echo(line)
        for doc_line in textwrap.wrap(doc, 76):
            echo("    " + doc_line)
    if problem:
        raise click.ClickException(f"configuration: {problem}")


# -- helpers: app, tasks, settings -------------------------------------------


def _app(ctx: click.Context) -> Any:
    obj = ctx.obj
    if obj is None or getattr(obj, "app", None) is None:
        raise click.UsageError("run it through Celery: celery -A proj redlock ...")
    return obj.app


def _locked_tasks(app: Any) -> dict[str, LockedTask]:
    """The app's LockedTasks by name (after importing the app's task modules)."""
    app.loader.import_default_modules()
    return {
        name: task
        for name, task in sorted(app.tasks.items())
        if isinstance(task, LockedTask) and getattr(task, "_lock_plan", None) is not None
    }


def _locked_task(app: Any, name: str) -> LockedTask:
    tasks = _locked_tasks(app)
    if name in tasks:
        return tasks[name]
    known = ", ".join(tasks) if tasks else "none"
    what = "is not a LockedTask" if name in app.tasks else "is not a task registered in the app"
    raise click.ClickException(f"{name!r} {what}. The app's LockedTasks: {known}")


def _plan(task: LockedTask) -> LockPlan:
    plan = task._lock_plan
    if plan is None:  # _locked_tasks keeps bound tasks only; this is for the type checker
        raise click.ClickException(f"{task.name!r} has no lock plan")
    return plan


def _target_settings(app: Any, task: str | None) -> tuple[str, conf.LockSettings]:
    if task:
        locked = _locked_task(app, task)
        return f"task {locked.name}", _plan(locked).settings
    return "the app", conf.resolve(app, owner=OWNER)


def _lock_target(
    app: Any,
    task: str | None,
    args: list | None,
    kwargs: dict | None,
    lock_name: str | None,
) -> tuple[str, conf.LockSettings, str]:
    """(label, settings, lock name) of the one lock a command is about."""
    if not task and not lock_name:
        raise click.UsageError("name a lock: TASK [--args JSON] [--kwargs JSON], or --name LOCK")
    if lock_name and (args is not None or kwargs is not None):
        raise click.UsageError("--name takes no --args/--kwargs: the name already includes them")
    label, settings = _target_settings(app, task)
    if lock_name:
        # Accept the Redis key itself, as redis-cli shows it.
        full = f"{settings.key_prefix}:lock:"
        return label, settings, lock_name[len(full) :] if lock_name.startswith(full) else lock_name
    assert task  # checked above: a TASK or a --name
    plan = _plan(_locked_task(app, task))
    return label, settings, plan.keys.build(args or [], kwargs or {})


def _all_settings(app: Any) -> list[tuple[str, conf.LockSettings]]:
    """Each distinct (nodes, prefix) the app and its LockedTasks use, with who uses it."""
    candidates = []
    try:
        candidates.append(("the app", conf.resolve(app, owner=OWNER)))
    except ConfigurationError:
        pass  # every task may name its own nodes; fail below only if none does
    candidates += [(f"task {name}", _plan(t).settings) for name, t in _locked_tasks(app).items()]
    if not candidates:
        conf.resolve(app, owner=OWNER)  # raises the configuration error
    groups: dict[tuple, tuple[list[str], conf.LockSettings]] = {}
    for label, settings in candidates:
        ident = (
            tuple(n if isinstance(n, str) else id(n) for n in settings.nodes),
            settings.key_prefix,
        )
        groups.setdefault(ident, ([], settings))[0].append(label)
    if len(groups) == 1:  # the usual case: everyone shares the app's nodes
        return [(candidates[0][0], candidates[0][1])]
    return [(", ".join(labels), settings) for labels, settings in groups.values()]


@contextmanager
def _connect(settings: conf.LockSettings, timeout: float) -> Iterator[tuple[Redlock, list[str]]]:
    """A Redlock on ``settings``' nodes with the CLI's timeout, and its construction warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # report "use an odd number of nodes" in the output
        client = Redlock(settings.nodes, **{**settings.redlock_options(), "node_timeout": timeout})
    try:
        yield client, [str(w.message) for w in caught]
    finally:
        for node in client.nodes:
            node.close()


# -- helpers: reading keys ---------------------------------------------------


@dataclass
class _NodeView:
    """One node's copy of one key."""

    node: str
    error: str | None = None
    value: str | None = None
    pttl_ms: int | None = None
    fence: str | None = None

    def as_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"node": self.node, "error": self.error}
        return {
            "node": self.node,
            "holder": self.value,
            "task_id": _task_id(self.value),
            "pttl_ms": self.pttl_ms if self.value is not None else None,
            "fence": self.fence,
        }


@dataclass
class _QuorumView:
    """What a majority of all configured nodes agrees on about one key."""

    owner: str | None
    remaining: float | None
    votes: int
    present: int
    answered: int
    quorum: int
    total: int

    @classmethod
    def of(cls, views: Sequence[_NodeView], quorum: int) -> _QuorumView:
        answered = sum(1 for v in views if v.error is None)
        owners = Counter(v.value for v in views if v.error is None and v.value)
        present = sum(owners.values())
        owner, votes = owners.most_common(1)[0] if owners else (None, 0)
        if votes < quorum:
            return cls(None, None, votes, present, answered, quorum, len(views))
        pttls = [
            v.pttl_ms
            for v in views
            if v.value == owner and v.pttl_ms is not None and v.pttl_ms >= 0
        ]
        return cls(
            owner,
            min(pttls) / 1000.0 if pttls else None,
            votes,
            present,
            answered,
            quorum,
            len(views),
        )

    @property
    def known(self) -> bool:
        """False when too few nodes answered to tell held from free."""
        return self.owner is not None or self.answered >= self.quorum

    def summary(self) -> str:
        """The holder in a few words, for a table cell."""
        if self.owner is None:
            return "-" if self.known else "?"
        task_id = _task_id(self.owner)
        return f"task {task_id}" if task_id else self.owner

    def nodes_text(self) -> str:
        """Where the holder's key is, for a table cell."""
        if self.owner is not None:
            return f"{self.votes}/{self.total} nodes"
        if not self.known:
            return f"unknown ({self.answered}/{self.total} answered)"
        return f"no majority ({self.present}/{self.total} with a key)"

    def describe(self) -> str:
        """The holder in a sentence."""
        if self.owner is None:
            if not self.known:
                return (
                    f"unknown: only {self.answered} of {self.total} nodes answered, "
                    f"{self.quorum} needed"
                )
            if self.present:
                return f"none: no majority agrees (a key on {self.present} of {self.total} nodes)"
            return "none: the lock is free"
        left = "no TTL" if self.remaining is None else f"{self.remaining:.3f} s left"
        return (
            f"{self.summary()} (owner {self.owner}), {left}, on {self.votes} of {self.total} nodes"
        )


def _inspect(client: Redlock, name: str) -> list[_NodeView]:
    views = []
    for item in client.inspect(name):
        if "error" in item:
            views.append(_NodeView(item["node"], error=item["error"]))
        else:
            views.append(
                _NodeView(item["node"], None, item["holder"], item["pttl_ms"], item["fence"])
            )
    return views


def _peek(client: Redlock, key: Any, timeout: float, down: dict[int, str]) -> list[_NodeView]:
    """Value and PTTL of ``key`` on every node, in one round.

    Nodes in ``down`` (index -> error) are not asked, and a node that fails now
    joins them: a hung node costs one timeout per listing, not one per key.
    """
    live = [i for i in range(len(client.nodes)) if i not in down]
    replies = (
        run_script(_PEEK, [client.nodes[i] for i in live], (key,), (), timeout) if live else []
    )
    views = [_NodeView(node.name, error=down.get(i)) for i, node in enumerate(client.nodes)]
    for i, reply in zip(live, replies):
        if isinstance(reply, Exception):
            down[i] = views[i].error = _error_text(reply)
        else:
            value = None if reply[0] is None else _text(reply[0])
            views[i] = _NodeView(client.nodes[i].name, None, value, int(reply[1]))
    return views


def _scan_all(
    client: Redlock, pattern: str, limit: int, timeout: float
) -> tuple[list[bytes], bool, dict[int, str]]:
    """SCAN every node for ``pattern``.

    Returns:
        The keys found (sorted, at most ``limit``), whether a node had more,
        and the nodes that failed (index -> error).
    """
    found: set[bytes] = set()
    truncated = False
    down: dict[int, str] = {}
    for index, node in enumerate(client.nodes):
        keys, more, error = _scan(node, pattern, limit, timeout)
        found.update(keys)
        truncated = truncated or more
        if error is not None:
            down[index] = error
    keys = sorted(found)
    return keys[:limit], truncated or len(keys) > limit, down


def _scan(
    node: Node, pattern: str, limit: int, timeout: float
) -> tuple[list[bytes], bool, str | None]:
    """SCAN one node until done or ``limit`` keys: (keys, stopped early, error)."""
    found: set[bytes] = set()  # SCAN may return a key twice
    cursor: Any = b"0"
    while True:
        # Each call is bounded by the timeout; COUNT keeps the number of calls small.
        reply = gather([node], ("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_COUNT), timeout)[0]
        if isinstance(reply, Exception):
            return sorted(found), False, _error_text(reply)
        cursor, keys = reply
        found.update(keys)
        if int(cursor) == 0:
            return sorted(found), False, None
        if len(found) >= limit:
            return sorted(found)[:limit], True, None


def _down_problems(ctx: click.Context, client: Redlock, down: dict[int, str]) -> str | None:
    """Print the nodes that failed; an error text if they leave less than a quorum."""
    for index, error in sorted(down.items()):
        ctx.obj.echo(f"DOWN    {client.nodes[index].name}: {error}")
    answered = len(client.nodes) - len(down)
    if answered < client.quorum:
        return (
            f"only {answered} of {len(client.nodes)} Redis nodes answered, {client.quorum} needed; "
            "down: " + "; ".join(f"{client.nodes[i].name} ({e})" for i, e in sorted(down.items()))
        )
    return None


def _echo_errors(ctx: click.Context, views: Sequence[_NodeView]) -> None:
    down = [v for v in views if v.error is not None]
    if down:
        ctx.obj.echo("")
    for v in down:
        ctx.obj.echo(f"DOWN    {v.node}: {v.error}")


def _unavailable_text(views: Sequence[_NodeView], quorum: int) -> str:
    down = [v for v in views if v.error is not None]
    return (
        f"only {len(views) - len(down)} of {len(views)} Redis nodes answered, {quorum} needed; "
        "down: " + "; ".join(f"{v.node} ({v.error})" for v in down)
    )


# -- helpers: text -------------------------------------------------------------


def _table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, show_header: bool = True
) -> list[str]:
    """Aligned columns, two spaces apart; the last column is not padded."""
    lines = ([list(header)] if show_header else []) + [list(r) for r in rows]
    if not lines:
        return []
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return [
        "  ".join([cell.ljust(width) for cell, width in zip(line, widths)] + [line[-1]]).rstrip()
        for line in lines
    ]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _printable(value: str) -> str:
    # Raw, unless it would break the table (newlines, control characters).
    return value if value.isprintable() else repr(value)


def _error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _task_id(owner: str | None) -> str | None:
    if not owner:
        return None
    first = owner.split(OWNER_SEP, 1)[0]
    return None if first == "-" or first == owner else first


def _ms_text(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def _ttl_text(pttl_ms: int | None) -> str:
    if pttl_ms is None or pttl_ms == -2:
        return "-"
    if pttl_ms == -1:
        return "no TTL"
    return f"{pttl_ms / 1000:.3f} s"


def _slot_number(slot: str) -> float:
    try:
        return float(slot)
    except ValueError:
        return float("-inf")


def _slot_time(slot: str) -> str:
    number = _slot_number(slot)
    if number == float("-inf"):
        return "?"
    try:
        when = datetime.fromtimestamp(number, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "?"
    spec = "seconds" if number == int(number) else "milliseconds"
    return when.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


_URL_PASSWORD = re.compile(r"(://[^:/@\s,]*:)[^\s/,]+@")  # greedy: up to the last @
_QUERY_PASSWORD = re.compile(r"(password=)[^&\s]+", re.IGNORECASE)


def mask_url(text: str) -> str:
    """``text`` with the passwords of any Redis URLs in it replaced by ``***``."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def _setting_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(_setting_text(v) for v in value)
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if value is None or isinstance(value, (bool, int)):
        return str(value)
    try:  # a redis.Redis client given as a node
        return f"{_describe(value)} (client)"
    except AttributeError:
        return mask_url(repr(value))
