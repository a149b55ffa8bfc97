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

from . import _scripts, conf
from ._nodes import Node, _describe, gather, mask_url, run_script
from .exceptions import ConfigurationError, LockKeyError, QuorumUnavailable, RedlockError
from .redlock import Holder, Redlock, _holder
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

#: ``maxmemory-policy`` values that never evict a key. ``volatile-*`` policies
#: evict keys with a TTL, which is every lock; ``allkeys-*`` evict anything.
_SAFE_POLICIES = ("noeviction",)


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
        help="A lock name as `list` shows it (or its full Redis key), instead of TASK and "
        "its arguments. With TASK too, TASK only picks the nodes and prefix.",
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
    instead of a master, two URLs reaching one server, no AOF. Exits with 2
    when fewer than a quorum of the nodes answer.
    """
    label, settings = _target_settings(app, task)
    with _connect(settings, timeout) as (client, notes):
        probes = [_Probe.of(node, timeout) for node in client.nodes]
    quorum, total = client.quorum, len(client.nodes)
    echo(
        f"Lock nodes of {label} (prefix {settings.key_prefix!r}, quorum {quorum} of {total}, "
        f"redlock_node_timeout {_ms_text(settings.node_timeout)})"
    )
    echo("")
    header = ["NODE", "PING", "VERSION", "ROLE", "MAXMEMORY-POLICY", "PERSISTENCE"]
    echo(_table([p.cells() for p in probes], header))
    findings = [f"WARNING {note}" for note in notes] + _findings(probes, settings.node_timeout)
    if findings:
        echo("\n" + "\n".join(findings))
    down = [(p.name, p.error) for p in probes if p.error is not None]
    answered = total - len(down)
    reachable = "reachable" if answered >= quorum else "UNREACHABLE"
    echo(f"\nQuorum: {reachable} ({answered} of {total} nodes answered, {quorum} needed)")
    problem = _outage(down, total, quorum)
    if problem:
        raise Unavailable(problem)


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

    @classmethod
    def of(cls, node: Node, timeout: float) -> _Probe:
        # One node at a time, so the PING latency is this node's alone.
        probe = cls(node.name)
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
        lines = (line.partition(":") for line in _text(info).splitlines())
        fields = {k: v.strip() for k, sep, v in lines if sep and not k.startswith("#")}
        probe.version = fields.get("redis_version", "?")
        if "valkey_version" in fields:
            probe.version = f"valkey {fields['valkey_version']}"
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

    def cells(self) -> list[str]:
        """The row of the ``nodes`` table."""
        if self.error is not None:
            return [self.name, "DOWN", "-", "-", "-", "-"]
        policy = self.policy if self.policy in _SAFE_POLICIES else f"{self.policy} (UNSAFE)"
        persistence = "-" if self.aof is None else "aof off"
        if self.aof:
            persistence = f"aof, fsync {self.fsync or '?'}"
        return [self.name, _ms_text(self.latency), self.version, self.role, policy, persistence]


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

    The lock is TASK's for the arguments given with --args/--kwargs (the key
    is computed exactly as the worker computes it), or --name. TASK must be a
    LockedTask of the app.
    """
    label, settings, name = _lock_target(app, **options)
    with _connect(settings, timeout) as (client, _):
        key, fence_key = client.keys(name)
        lock = _read(client, key, fence_key)
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
            "nodes": [v.as_json() for v in lock.views],
        }
        if holder.owner is not None:
            out["holder"] = {
                "owner": holder.owner,
                "task_id": holder.task_id,
                "remaining": holder.remaining,
                "nodes": lock.votes,
            }
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
        echo(_table(about) + "\n")
        rows = [[v.node, *v.cells(), v.fence or "-"] for v in lock.views]
        echo(_table(rows, ["NODE", "HOLDER", "TTL", "FENCE"]))
        lock.echo_down(echo)
    if problem:
        raise Unavailable(problem)


# -- list --------------------------------------------------------------------


@_command("list", _TASK, _LIMIT)
def list_(
    app: Any, echo: Callable, task: str | None, limit: int, timeout: float, **kwargs: Any
) -> None:
    """List the lock keys on the nodes (all, or only TASK's), with holders and TTLs.

    One line per key with the quorum's view (a key is held when a majority of
    all configured nodes hold the same owner), then one line per node. Keys are
    found with SCAN, never KEYS. Without TASK, every node set the app and its
    LockedTasks use is scanned.
    """
    if task:
        plan = _plan(app, task)
        groups = [(f"task {task}", plan.settings, _glob_escape(plan.lock_name) + ":{*}")]
    else:
        groups = [(label, settings, "*") for label, settings in _all_settings(app)]
    failed = []
    for index, (label, settings, tail) in enumerate(groups):
        if index:
            echo("")
        with _connect(settings, timeout) as (client, _):
            base = f"{client.key_prefix}:lock:"
            scan = _Scan(client, _glob_escape(base) + tail, limit)
            rows, held = [], 0
            for raw_key in scan.keys:
                name = _text(raw_key)[len(base) :]
                lock = scan.read(raw_key, f"{client.key_prefix}:fence:{name}")
                remaining = lock.holder.remaining
                ttl = _ttl_text(None if remaining is None else int(remaining * 1000))
                rows.append([name, lock.summary(), ttl, lock.nodes_text()])
                rows += [["    " + v.node, *v.cells(), ""] for v in lock.views]
                held += lock.holder.owner is not None
            header = ["LOCK NAME / NODE", "HOLDER", "TTL", "QUORUM"]
            summary = f"{_plural(len(scan.keys), 'key')}, {held} held by a quorum."
            problem = scan.report(echo, f"Locks of {label}", header, rows, summary)
        if problem:
            failed.append(problem)
    if failed:
        raise Unavailable("; ".join(failed))


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
)
def release(
    app: Any, echo: Callable, force: bool, task_id: str | None, timeout: float, **options: Any
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
    _, settings, name = _lock_target(app, **options)
    with _connect(settings, timeout) as (client, _):
        key, fence_key = client.keys(name)
        total = len(client.nodes)
        lock = _read(client, key, fence_key)
        problem = lock.outage()
        if problem:
            lock.echo_down(echo)
            raise Unavailable(problem + "; nothing released")
        if task_id is not None:
            deleted = client.release_owned_by(name, task_id)
            if deleted:
                echo(f"Released {key} on {deleted} of {total} nodes (held by task {task_id}).")
            elif not lock.owners:
                echo(f"Nothing to release: {key} is free on every node that answered.")
            else:
                raise click.ClickException(
                    f"not released: {key} is not held by task {task_id} (holder: {lock.describe()})"
                )
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
            if _read(client, key, fence_key).owners - lock.owners:
                raise click.ClickException(
                    f"not deleted: {key} was taken by another holder meanwhile; run again"
                )
        replies = gather(client.nodes, ("DEL", key), timeout)
    errors = [
        (node.name, _error_text(reply))
        for node, reply in zip(client.nodes, replies)
        if isinstance(reply, Exception)
    ]
    deleted = sum(1 for r in replies if r == 1)
    missing = total - deleted - len(errors)
    had_none = f" ({missing} had no such key)." if missing else "."
    echo(f"Deleted {key} on {deleted} of {total} nodes{had_none}")
    _echo_down(echo, errors, ": its copy expires with its TTL.")
    if total - len(errors) < client.quorum:
        raise Unavailable(f"only {total - len(errors)} of {total} nodes answered the delete")


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
    with _connect(conf.resolve(app, owner=OWNER), timeout) as (client, _):
        base = f"{client.key_prefix}:beat:"
        tail = _glob_escape(entry) + ":*" if entry else "*"
        scan = _Scan(client, _glob_escape(base) + tail, limit)
        slots = []
        for raw_key in scan.keys:
            entry_name, _, slot = _text(raw_key)[len(base) :].rpartition(":")
            if entry is None or entry_name == entry:  # "a:*" also matches entry "a:b"
                # A claim has no fence key: INSPECT reads the claim's own key twice.
                slots.append((entry_name, slot, scan.read(raw_key, raw_key).views))
        slots.sort(key=lambda s: (s[0], -_slot_number(s[1])))
        rows = []
        for entry_name, slot, views in slots:
            # No values when the claim expired between SCAN and INSPECT.
            values = Counter(v.value for v in views if v.value is not None)
            for value, votes in values.most_common():
                ttl = _ttl_text(min(v.pttl_ms for v in views if v.value == value))
                nodes = f"{votes}/{len(views)}"
                rows.append([entry_name, slot, _slot_time(slot), nodes, ttl, _printable(value)])
        header = ["ENTRY", "SLOT", "TIME (UTC)", "NODES", "TTL", "CLAIM"]
        problem = scan.report(echo, "Beat claims", header, rows, f"{_plural(len(slots), 'claim')}.")
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
        resolved = _plan(app, task).settings
    else:
        try:
            resolved = conf.resolve(app, owner=OWNER)
        except ConfigurationError as exc:
            problem = str(exc)
    rows = []
    for setting in conf.SETTINGS:
        field = setting.name[len("redlock_") :]
        override = getattr(app.tasks[task], setting.task_attr, None) if task else None
        if override is not None:
            value, source = override, f"task.{setting.task_attr}"
        elif app.conf.get(setting.name) is not None:
            value, source = app.conf.get(setting.name), "app.conf"
        else:
            value, source = setting.default, "default"
        # Settings that LockSettings does not carry (beat's, say) show as configured.
        if resolved is not None and hasattr(resolved, field):
            if value is None:  # filled in by resolve()
                derived = {"nodes": "broker_url", "heartbeat_interval": "ttl / 3"}
                source = derived.get(field, "derived")
            value = getattr(resolved, field)
        rows.append([setting.name, source, _setting_text(value)])
    echo(f"Settings of {f'task {task}' if task else 'the app'}\n")
    head, *lines = _table(rows, ["SETTING", "FROM", "VALUE"]).split("\n")
    echo(head)
    for line, setting in zip(lines, conf.SETTINGS):
        echo("\n".join([line] + ["    " + doc for doc in textwrap.wrap(setting.doc, 76)]))
    if problem:
        raise click.ClickException(f"configuration: {problem}")


# -- helpers: app, tasks, settings -------------------------------------------


def _locked_plans(app: Any) -> dict[str, LockPlan]:
    """The lock plans of the app's LockedTasks by task name (after importing its task modules)."""
    app.loader.import_default_modules()
    return {
        name: task._lock_plan
        for name, task in sorted(app.tasks.items())
        if isinstance(task, LockedTask) and task._lock_plan is not None
    }


def _plan(app: Any, task: str) -> LockPlan:
    plans = _locked_plans(app)
    if task in plans:
        return plans[task]
    what = "is not a LockedTask" if task in app.tasks else "is not a task registered in the app"
    known = ", ".join(plans) or "none"
    raise click.ClickException(f"{task!r} {what}. The app's LockedTasks: {known}")


def _target_settings(app: Any, task: str | None) -> tuple[str, conf.LockSettings]:
    if task:
        return f"task {task}", _plan(app, task).settings
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
        return f"task {task}", plan.settings, plan.keys.build(args_ or [], kwargs_ or {})
    if args_ is not None or kwargs_ is not None:
        raise click.UsageError("--name takes no --args/--kwargs: the name already includes them")
    label, settings = _target_settings(app, task)
    # Accept the Redis key itself, as redis-cli shows it.
    full = f"{settings.key_prefix}:lock:"
    return label, settings, lock_name[len(full) :] if lock_name.startswith(full) else lock_name


def _all_settings(app: Any) -> list[tuple[str, conf.LockSettings]]:
    """Each distinct (nodes, prefix) the app and its LockedTasks use, with who uses it."""
    candidates = []
    try:
        candidates.append(("the app", conf.resolve(app, owner=OWNER)))
    except ConfigurationError:
        pass  # every task may name its own nodes; fail below only if none does
    candidates += [(f"task {name}", plan.settings) for name, plan in _locked_plans(app).items()]
    if not candidates:
        conf.resolve(app, owner=OWNER)  # raises the configuration error
    groups: dict[tuple, tuple[list[str], conf.LockSettings]] = {}
    for label, settings in candidates:
        nodes = tuple(n if isinstance(n, str) else id(n) for n in settings.nodes)
        groups.setdefault((nodes, settings.key_prefix), ([], settings))[0].append(label)
    if len(groups) == 1:  # the usual case: everyone shares the app's nodes
        return candidates[:1]
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
    """One node's copy of one key, or the node's error."""

    node: str
    error: str | None = None
    value: str | None = None
    pttl_ms: int = -2  # as PTTL says it: -2 no key, -1 no TTL
    fence: str | None = None

    def cells(self) -> list[str]:
        """The HOLDER and TTL cells of a table row."""
        return ["DOWN", "-"] if self.error else [self.value or "-", _ttl_text(self.pttl_ms)]

    def as_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"node": self.node, "error": self.error}
        return {
            "node": self.node,
            "holder": self.value,
            "task_id": Holder(self.value, None).task_id,
            "pttl_ms": self.pttl_ms if self.value is not None else None,
            "fence": self.fence,
        }


class _Key:
    """One key as each node sees it, and the holder a quorum of all the nodes agrees on."""

    def __init__(self, views: list[_NodeView], quorum: int):
        self.views = views
        self.quorum = quorum
        self.holder = _holder([(v.value, v.pttl_ms) for v in views if v.value], quorum)
        self.votes = sum(1 for v in views if v.value and v.value == self.holder.owner)
        self.answered = sum(1 for v in views if v.error is None)
        self.present = sum(1 for v in views if v.value)
        self.owners = {v.value for v in views if v.value}
        #: (node, error) of each node that did not answer.
        self.down = [(v.node, v.error) for v in views if v.error is not None]

    @property
    def known(self) -> bool:
        """False when too few nodes answered to tell held from free."""
        return self.holder.owner is not None or self.answered >= self.quorum

    def outage(self) -> str | None:
        return _outage(self.down, len(self.views), self.quorum)

    def summary(self) -> str:
        """The holder in a few words, for a table cell."""
        if self.holder.owner is None:
            return "-" if self.known else "?"
        return f"task {self.holder.task_id}" if self.holder.task_id else self.holder.owner

    def nodes_text(self) -> str:
        """Where the holder's key is, for a table cell."""
        total = len(self.views)
        if self.holder.owner is not None:
            return f"{self.votes}/{total} nodes"
        if not self.known:
            return f"unknown ({self.answered}/{total} answered)"
        return f"no majority ({self.present}/{total} with a key)"

    def describe(self) -> str:
        """The holder in a sentence."""
        total = len(self.views)
        if not self.known:
            return f"unknown: only {self.answered} of {total} nodes answered, {self.quorum} needed"
        if self.holder.owner is None and self.present:
            return f"none: no majority agrees (a key on {self.present} of {total} nodes)"
        if self.holder.owner is None:
            return "none: the lock is free"
        remaining = self.holder.remaining
        left = "no TTL" if remaining is None else f"{remaining:.3f} s left"
        where = f"on {self.votes} of {total} nodes"
        return f"{self.summary()} (owner {self.holder.owner}), {left}, {where}"

    def echo_down(self, echo: Callable) -> None:
        if self.down:
            echo("")
        _echo_down(echo, self.down)


def _read(client: Redlock, key: Any, fence_key: Any, down: dict[Node, str] | None = None) -> _Key:
    """Holder, PTTL and fence of ``key`` on every node, in one INSPECT round.

    Nodes in ``down`` (node -> error) are not asked, and a node that fails now
    joins them: a listing pays for a hung node once, not once per key.
    """
    down = {} if down is None else down
    live = [node for node in client.nodes if node not in down]
    replies = run_script(_scripts.INSPECT, live, (key, fence_key), (), client.node_timeout)
    answers = dict(zip(live, replies))
    views = []
    for node in client.nodes:
        if isinstance(answers.get(node), Exception):
            down[node] = _error_text(answers[node])
        if node in down:
            views.append(_NodeView(node.name, error=down[node]))
            continue
        holder, pttl_ms, fence = answers[node]
        holder, fence = (None if v is None else _text(v) for v in (holder, fence))
        views.append(_NodeView(node.name, None, holder, int(pttl_ms), fence))
    return _Key(views, client.quorum)


class _Scan:
    """The keys matching ``pattern`` on every node, found with SCAN, at most ``limit``."""

    def __init__(self, client: Redlock, pattern: str, limit: int):
        self.client, self.pattern, self.limit = client, pattern, limit
        self.down: dict[Node, str] = {}  # the nodes that failed, and why
        self.truncated = False  # a node had more than ``limit`` keys
        found: set[bytes] = set()
        for node in client.nodes:
            seen: set[bytes] = set()  # SCAN may return a key twice
            cursor: Any = b"0"
            while True:
                # Each call is bounded by the timeout; COUNT keeps the number of calls small.
                command = ("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_COUNT)
                reply = gather([node], command, client.node_timeout)[0]
                if isinstance(reply, Exception):
                    self.down[node] = _error_text(reply)
                    break
                cursor, keys = reply
                seen.update(keys)
                if int(cursor) == 0:
                    break
                if len(seen) >= limit:
                    self.truncated = True
                    break
            found |= seen
        self.keys = sorted(found)[:limit]
        self.truncated = self.truncated or len(found) > limit

    def read(self, key: bytes, fence_key: Any) -> _Key:
        return _read(self.client, key, fence_key, self.down)

    def report(
        self, echo: Callable, title: str, header: list[str], rows: list[list[str]], summary: str
    ) -> str | None:
        """Print the listing; the error text if fewer than a quorum of nodes answered."""
        client = self.client
        echo(f"{title}: {len(client.nodes)} nodes, quorum {client.quorum}, keys {self.pattern}\n")
        if rows:
            echo(_table(rows, header) + "\n")
        if self.truncated:
            summary += f" Stopped at --limit {self.limit}: more keys may exist."
        echo(summary)
        down = [(node.name, self.down[node]) for node in client.nodes if node in self.down]
        _echo_down(echo, down)
        return _outage(down, len(client.nodes), client.quorum)


def _outage(down: Sequence[tuple[str, str]], total: int, quorum: int) -> str | None:
    """The error text when the nodes ``down`` ((name, error) each) leave less than a quorum."""
    if total - len(down) >= quorum:
        return None
    names = "; ".join(f"{name} ({error})" for name, error in down)
    answered = total - len(down)
    return f"only {answered} of {total} Redis nodes answered, {quorum} needed; down: {names}"


def _echo_down(echo: Callable, down: Sequence[tuple[str, str]], suffix: str = "") -> None:
    for name, error in down:
        echo(f"DOWN    {name}: {error}{suffix}")


# -- helpers: text -------------------------------------------------------------


def _table(rows: Sequence[Sequence[str]], header: Sequence[str] = ()) -> str:
    """Aligned columns, two spaces apart; the last column is not padded."""
    lines = [list(header), *rows] if header else list(rows)
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    return "\n".join(
        "  ".join([cell.ljust(width) for cell, width in zip(line, widths)] + [line[-1]]).rstrip()
        for line in lines
    )


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _printable(value: str) -> str:
    # Raw, unless it would break the table (newlines, control characters).
    return value if value.isprintable() else repr(value)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _ms_text(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def _ttl_text(pttl_ms: int | None) -> str:
    if pttl_ms is None or pttl_ms == -2:
        return "-"
    return "no TTL" if pttl_ms == -1 else f"{pttl_ms / 1000:.3f} s"


def _slot_number(slot: str) -> float:
    try:
        return float(slot)
    except ValueError:
        return float("-inf")


def _slot_time(slot: str) -> str:
    number = _slot_number(slot)
    try:
        when = datetime.fromtimestamp(number, timezone.utc)
    except (OverflowError, OSError, ValueError):  # not a number, or out of range
        return "?"
    spec = "seconds" if number == int(number) else "milliseconds"
    return when.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


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
