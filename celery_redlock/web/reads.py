"""What the dashboard shows, read the way ``celery redlock nodes/list/status`` read it.

Every lock, permit, claim, debounce and beat key goes through the CLI's own
quorum read (:meth:`Redlock.inspect_key` and :meth:`Redlock.agreed`, wrapped in
a :class:`~celery_redlock._format.KeyReport`), the node table through
:meth:`Redlock.node_info` and the rules of :mod:`celery_redlock._health`.
Only the finding of keys differs: one SCAN page per node per family and
refresh (:mod:`.pager`), never a walk to the end.

A node that fails is skipped for the rest of a refresh (as ``list`` does), so
a hung node costs one timeout per refresh, not one per key.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from contextlib import ExitStack
from typing import Any

from .._format import (
    KeyReport,
    glob_escape,
    nodes_text,
    outage,
    printable,
    slot_number,
    slot_time,
)
from .._health import checks, findings
from .._reading import all_settings, connect, key_report, locked_plans
from ..conf import LockSettings, nodes_from_broker
from ..core import OWNER_SEP, STARTED_MARK, NodeInfo, QuorumUnavailable, Redlock
from .pager import Pager, RawKey
from .watch import Watch

__all__ = ["FAMILIES", "Board", "Group"]

#: The key families shown, in the page's order. ``rate`` is shown generically.
FAMILIES = ("lock", "permit", "claim", "queue", "burst", "throttle", "rate", "beat")


class Group:
    """One set of lock nodes (and key prefix) the app or some of its tasks use."""

    def __init__(self, label: str, settings: LockSettings, client: Redlock, notes: list[str]):
        self.label, self.settings, self.client, self.notes = label, settings, client, notes
        self.pager: Pager


class Board:
    """The app's lock nodes and keys, read on demand; one per WSGI app, shared by its threads."""

    def __init__(self, celery_app: Any, timeout: float = 0.5, scan_count: int = 1000):
        self.app = celery_app
        self.timeout = timeout
        self.scan_count = scan_count
        self.watch = Watch()
        self._stack = ExitStack()
        self._groups: list[Group] | None = None

    @property
    def groups(self) -> list[Group]:
        """Built at first use: the app's task modules are imported then, not at import."""
        if self._groups is None:
            groups = []
            for label, settings in all_settings(self.app):
                client, notes = self._stack.enter_context(connect(settings, self.timeout))
                group = Group(label, settings, client, notes)
                group.pager = Pager(client, self.scan_count)
                groups.append(group)
            self._groups = groups
        return self._groups

    def close(self) -> None:
        self._stack.close()

    def tasks_of(self) -> dict[str, list[str]]:
        """Lock name -> the LockedTasks that lock on it."""
        out: dict[str, list[str]] = {}
        for task, plan in locked_plans(self.app).items():
            out.setdefault(plan.lock_name, []).append(task)
        return out

    def plans_by_lock(self) -> dict[str, LockSettings]:
        return {plan.lock_name: plan.resolved for plan in locked_plans(self.app).values()}

    def tail(self, task: str | None) -> str:
        """The SCAN pattern (after ``{prefix}:{kind}:``) of a filter by task name."""
        if not task:
            return "*"
        plans = locked_plans(self.app)
        if task in plans:
            return glob_escape(plans[task].lock_name) + ":{*"
        return "*" + glob_escape(task) + "*"

    # -- the state ------------------------------------------------------------

    def state(self, cursors: dict[str, str], task: str | None = None) -> dict[str, Any]:
        """Every group's nodes and one page of each family. ``cursors``: ``"{g}.{kind}"`` ->
        the cursor of the page to read."""
        started = time.perf_counter()
        tasks = self.tasks_of()
        plans = self.plans_by_lock()
        out = []
        scans = 0
        for index, group in enumerate(self.groups):
            before = group.pager.scan_calls
            out.append(self._group(index, group, cursors, task, tasks, plans))
            scans += group.pager.scan_calls - before
        self.watch.prune()
        return {
            "time": time.time(),
            "filter": task or "",
            "groups": out,
            "scan_calls": scans,
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
        }

    def _group(
        self,
        index: int,
        group: Group,
        cursors: dict[str, str],
        task: str | None,
        tasks: dict[str, list[str]],
        plans: dict[str, LockSettings],
    ) -> dict[str, Any]:
        client, settings = group.client, group.settings
        infos = client.node_info()
        down = {info.lock_node: info.error for info in infos if info.error is not None}
        nodes = [_node_json(info) for info in infos]
        lines = [f"WARNING {note}" for note in group.notes]
        lines += findings(infos, settings.node_timeout, settings.min_replicas)
        tail = self.tail(task)
        families: dict[str, Any] = {}
        for kind in FAMILIES:
            family_tail = tail
            if kind == "permit" and tail != "*":
                family_tail = tail + ":*"
            if kind == "beat":
                family_tail = "*"
            page = group.pager.page(kind, family_tail, cursors.get(f"{index}.{kind}"), down)
            down.update(page.errors)
            rows = getattr(self, f"_{kind}_rows")(group, page.names, down, tasks, plans)
            families[kind] = {"cursor": page.cursor, "next": page.next, "rows": rows}
        total = len(client.nodes)
        gone = [(n.name, down[n.name]) for n in client.nodes if n.name in down]
        # a lone node said to be one, in its kind's words, as the worker's start line does
        from_broker = index == 0 and nodes_from_broker(self.app)
        about = nodes_text([client.nodes[0].name], 1, from_broker) if total == 1 else None
        return {
            "label": group.label,
            "prefix": settings.key_prefix,
            "quorum": client.quorum,
            "nodes_total": total,
            "answered": total - len(gone),
            "error": outage(gone, total, client.quorum),
            "nodes": nodes,
            "about": about,
            "findings": lines,
            "families": families,
        }

    # -- families -------------------------------------------------------------

    def _holder_row(
        self, key: str, name: str, report: KeyReport, tasks: dict[str, list[str]]
    ) -> dict[str, Any]:
        holder = report.holder
        row: dict[str, Any] = {
            **_identity(key, name, tasks),
            "held": holder.owner is not None,
            "known": report.known,
            "summary": report.summary(),
            "votes": report.votes,
            "present": report.present,
            "nodes": report.as_json(),
            "remaining": holder.remaining,
            "owner": holder.owner,
            "task_id": holder.task_id,
            "host": None,
            "pid": None,
            "fence": None,
            "age": None,
            "since_renewal": None,
            "suspect": False,
        }
        if holder.owner is not None:
            fields = holder.owner.split(OWNER_SEP)
            if len(fields) >= 4:
                row["host"], row["pid"] = fields[2], fields[3]
            fences = [v.fence for v in report.views if v.holder == holder.owner and v.fence]
            row["fence"] = max(fences, key=lambda f: (len(f), f)) if fences else None
            seen = self.watch.see(key, holder.owner, holder.remaining)
            row.update(age=seen.age, since_renewal=seen.since_renewal, suspect=seen.suspect)
        return row

    def _lock_rows(self, group: Group, names: list[str], down: dict, tasks: dict, plans: dict):
        prefix, rows = group.client.key_prefix, []
        for name in names:
            key = f"{prefix}:lock:{name}"
            report = _read(group.client, key, f"{prefix}:fence:{name}", down)
            rows.append(dict(self._holder_row(key, name, report, tasks), permit=0))
        return rows

    def _permit_rows(self, group: Group, names: list[str], down: dict, tasks: dict, plans: dict):
        prefix, rows = group.client.key_prefix, []
        for name in names:
            lock_name, _, permit = name.rpartition(":")
            key = f"{prefix}:permit:{name}"
            report = _read(group.client, key, f"{prefix}:fence:{lock_name}", down)
            row = self._holder_row(key, lock_name, report, tasks)
            rows.append(dict(row, permit=int(permit) if permit.isdigit() else permit))
        return rows

    def _claim_rows(self, group: Group, names: list[str], down: dict, tasks: dict, plans: dict):
        prefix, rows = group.client.key_prefix, []
        for name in names:
            report = _read(group.client, f"{prefix}:claim:{name}", None, down)
            rows.append(_claim_row(f"{prefix}:claim:{name}", name, report, tasks))
        return rows

    def _queue_rows(self, group: Group, names: list[str], down: dict, tasks: dict, plans: dict):
        """A queued key's waiting calls (lock_on_duplicate queue or supersede)."""
        prefix, rows = group.client.key_prefix, []
        for name in names:
            row = {**_identity(f"{prefix}:queue:{name}", name, tasks), "known": True}
            try:
                view = group.client.queue_peek(name)
            except QuorumUnavailable as exc:
                rows.append({**row, "known": False, "error": str(exc), "waiting": None})
                continue
            row.update(waiting=view.waiting, next=view.next, answered=view.answered)
            row["oldest_age"] = _parked_age(view.call)
            rows.append(row)
        return rows

    def _burst_rows(self, group: Group, names: list[str], down: dict, tasks: dict, plans: dict):
        prefix, rows = group.client.key_prefix, []
        for name in names:
            burst = _read(group.client, f"{prefix}:burst:{name}", None, down)
            claim = _read(group.client, f"{prefix}:claim:{name}", None, down)
            row = _claim_row(f"{prefix}:burst:{name}", name, claim, tasks)
            first = burst.holder.owner
            row["burst_started"] = int(first) / 1000 if first and first.isdigit() else None
            row["remaining"] = burst.holder.remaining
            settings = plans.get(row["lock_name"])
            due_in = None
            if settings is not None and claim.holder.remaining is not None:
                # The claim outlives the due time by enqueue_ttl (Redlock.debounce).
                due_in = claim.holder.remaining - settings.enqueue_ttl
            row["due"] = None if due_in is None else time.time() + due_in
            row["votes"], row["nodes_total"] = burst.votes, len(burst.views)
            rows.append(row)
        return rows

    def _throttle_rows(self, group: Group, names: list[str], down: dict, tasks: dict, plans: dict):
        prefix = group.client.key_prefix
        keys = [f"{prefix}:throttle:{name}" for name in names]
        rows = []
        for key, name, views in zip(keys, names, group.pager.read(keys, down)):
            row = _raw_row(key, name, views, group.client.quorum, tasks)
            fields = row["value"] if isinstance(row["value"], dict) else {}
            row["due"] = _ms_time(fields.get("due"))
            row["runs"] = fields.get("id") or None
            row["last_start"] = _ms_time(fields.get("start"))
            settings = plans.get(row["lock_name"])
            row["period"] = settings.throttle if settings is not None else None
            rows.append(row)
        return rows

    def _rate_rows(self, group: Group, names: list[str], down: dict, tasks: dict, plans: dict):
        prefix = group.client.key_prefix
        keys = [f"{prefix}:rate:{name}" for name in names]
        return [
            _raw_row(key, name, views, group.client.quorum, tasks)
            for key, name, views in zip(keys, names, group.pager.read(keys, down))
        ]

    def _beat_rows(self, group: Group, names: list[str], down: dict, tasks: dict, plans: dict):
        prefix, rows = group.client.key_prefix, []
        for name in names:
            entry, _, slot = name.rpartition(":")
            report = _read(group.client, f"{prefix}:beat:{name}", None, down)
            values = Counter(v.holder for v in report.views if v.holder is not None)
            for value, votes in values.most_common():
                pttl = min(v.pttl_ms for v in report.views if v.holder == value)
                rows.append(
                    {
                        "key": f"{prefix}:beat:{name}",
                        "entry": entry,
                        "slot": slot,
                        "slot_time": slot_time(slot),
                        "sent_by": printable(value),
                        "votes": votes,
                        "nodes_total": len(report.views),
                        "remaining": pttl / 1000 if pttl >= 0 else None,
                    }
                )
        rows.sort(key=lambda r: (-slot_number(str(r["slot"])), str(r["entry"])))
        return rows


# -- helpers -------------------------------------------------------------------


def split_name(name: str) -> tuple[str, str]:
    """(lock name, digest) of a key name ``lock_name:{digest}``; the digest may be empty."""
    head, sep, tail = name.rpartition(":{")
    if sep and tail.endswith("}"):
        return head, tail[:-1]
    return name, ""


def _read(client: Redlock, key: str, fence_key: str | None, down: dict) -> KeyReport:
    report = key_report(client, key, fence_key, skip=down)
    for node, error in report.down:  # a node that fails now is skipped from now on
        down.setdefault(node, error)
    return report


def _identity(key: str, name: str, tasks: dict) -> dict[str, Any]:
    """The columns every row starts with: the key, its lock name and digest, its tasks."""
    lock_name, digest = split_name(name)
    return {
        "key": key,
        "name": name,
        "lock_name": lock_name,
        "digest": digest,
        "tasks": tasks.get(lock_name, []),
    }


def _claim_row(key: str, name: str, report: KeyReport, tasks: dict) -> dict[str, Any]:
    value = report.holder.owner
    started = bool(value and value.startswith(STARTED_MARK))
    return {
        **_identity(key, name, tasks),
        "claimant": value[len(STARTED_MARK) :] if started and value else value,
        "state": None if value is None else ("started" if started else "queued"),
        "known": report.known,
        "remaining": report.holder.remaining,
        "votes": report.votes,
        "nodes_total": len(report.views),
    }


def _raw_row(key: str, name: str, views: list[RawKey], quorum: int, tasks: dict) -> dict[str, Any]:
    """A key of any type: the value most nodes hold, how many hold it, its smallest TTL."""
    present = [v for v in views if v.error is None and v.type != "none"]
    shapes = Counter(repr(v.value) for v in present)
    value, votes, kind, pttl = None, 0, "none", None
    if shapes:
        shape, votes = shapes.most_common(1)[0]
        agreeing = [v for v in present if repr(v.value) == shape]
        value, kind = agreeing[0].value, agreeing[0].type
        ttls = [v.pttl_ms for v in agreeing if v.pttl_ms >= 0]
        pttl = min(ttls) if ttls else None
    return {
        **_identity(key, name, tasks),
        "type": kind,
        "value": value,
        "votes": votes,
        "agreed": votes >= quorum,
        "nodes_total": len(views),
        "remaining": None if pttl is None else pttl / 1000,
    }


def _parked_age(call: str | None) -> float | None:
    """How long a parked call has waited, from the time its message records."""
    try:
        return max(0.0, time.time() - float(json.loads(call or "")["at"]))
    except (ValueError, KeyError, TypeError):
        return None


def _ms_time(text: Any) -> float | None:
    return int(text) / 1000 if isinstance(text, str) and text.isdigit() else None


def _node_json(info: NodeInfo) -> dict[str, Any]:
    if info.error is not None:
        return {"node": info.node, "kind": info.kind, "up": False, "error": info.error}
    return {
        "node": info.node,
        "kind": info.kind,
        "up": True,
        "error": None,
        "rtt_ms": round(info.latency * 1000, 2),
        "version": info.version,
        "role": info.role,
        "replicas": info.replicas,
        # only the settings this kind has, each with its verdict
        "checks": [{"label": c.label, "value": c.value, "unsafe": c.unsafe} for c in checks(info)],
    }
