"""Text of the ``celery redlock`` commands: aligned tables, durations, keys as nodes show them."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from .core import Holder, NodeView, mask_url, node_name, specific_type
from .core.exceptions import named_once
from .exceptions import ConfigurationError

__all__ = [
    "KeyReport",
    "echo_down",
    "glob_escape",
    "ms_text",
    "outage",
    "plural",
    "printable",
    "setting_text",
    "slot_number",
    "slot_time",
    "spare_text",
    "table",
    "ttl_text",
    "view_cells",
]


class KeyReport:
    """One key as each node sees it, and the holder a quorum of all the nodes agrees on."""

    def __init__(self, views: list[NodeView], quorum: int, holder: Holder):
        self.views = views
        self.quorum = quorum
        self.holder = holder
        self.votes = sum(1 for v in views if v.holder and v.holder == holder.owner)
        self.answered = sum(1 for v in views if v.error is None)
        self.present = sum(1 for v in views if v.holder)
        self.owners = {v.holder for v in views if v.holder}
        #: (node, error) of each node that did not answer.
        self.down = [(v.node, v.error) for v in views if v.error is not None]

    @property
    def known(self) -> bool:
        """False when too few nodes answered to tell held from free."""
        return self.holder.owner is not None or self.answered >= self.quorum

    def outage(self) -> str | None:
        return outage(self.down, len(self.views), self.quorum)

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

    def as_json(self) -> list[dict[str, Any]]:
        """Every node's view, for ``status --json``."""
        out: list[dict[str, Any]] = []
        for v in self.views:
            if v.error is not None:
                out.append({"node": v.node, "error": v.error})
                continue
            out.append(
                {
                    "node": v.node,
                    "holder": v.holder,
                    "task_id": Holder(v.holder, None).task_id,
                    "pttl_ms": v.pttl_ms if v.holder is not None else None,
                    "fence": v.fence,
                }
            )
        return out

    def echo_down(self, echo: Callable) -> None:
        if self.down:
            echo("")
        echo_down(echo, self.down)


def view_cells(view: NodeView) -> list[str]:
    """The HOLDER and TTL cells of a node's row."""
    return ["DOWN", "-"] if view.error else [view.holder or "-", ttl_text(view.pttl_ms)]


def outage(down: Sequence[tuple[str, str]], total: int, quorum: int) -> str | None:
    """The error text when the nodes ``down`` ((name, error) each) leave less than a quorum."""
    if total - len(down) >= quorum:
        return None
    names = "; ".join(named_once(name, error) for name, error in down)
    answered = total - len(down)
    return f"only {answered} of {total} lock nodes answered, {quorum} needed; down: {names}"


def echo_down(echo: Callable, down: Sequence[tuple[str, str]], suffix: str = "") -> None:
    for name, error in down:
        echo(f"DOWN    {named_once(name, error)}{suffix}")


def table(rows: Sequence[Sequence[str]], header: Sequence[str] = ()) -> str:
    """Aligned columns, two spaces apart; the last column is not padded."""
    lines = [list(header), *rows] if header else list(rows)
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    return "\n".join(
        "  ".join([cell.ljust(width) for cell, width in zip(line, widths)] + [line[-1]]).rstrip()
        for line in lines
    )


def printable(value: str) -> str:
    """Raw, unless it would break the table (newlines, control characters)."""
    return value if value.isprintable() else repr(value)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def spare_text(answered: int, quorum: int) -> str:
    """How many more node failures a quorum of ``answered`` nodes survives, in words."""
    spare = answered - quorum
    more = plural(spare, "more node failure") if spare else "no further node failure"
    return f"the quorum tolerates {more}"


def ms_text(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def ttl_text(pttl_ms: int | None) -> str:
    if pttl_ms is None or pttl_ms == -2:
        return "-"
    return "no TTL" if pttl_ms == -1 else f"{pttl_ms / 1000:.3f} s"


def slot_number(slot: str) -> float:
    try:
        return float(slot)
    except ValueError:
        return float("-inf")


def slot_time(slot: str) -> str:
    number = slot_number(slot)
    try:
        when = datetime.fromtimestamp(number, timezone.utc)
    except (OverflowError, OSError, ValueError):  # not a number, or out of range
        return "?"
    spec = "seconds" if number == int(number) else "milliseconds"
    return when.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def setting_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(setting_text(v) for v in value)
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if value is None or isinstance(value, (bool, int)):
        return str(value)
    try:  # a redis.Redis client given as a node
        return f"{node_name(value)} (client)"
    except ConfigurationError:
        return mask_url(repr(value))


def nodes_text(names: Sequence[str], quorum: int, from_broker: bool) -> str:
    """One line on where the locks live; a single node is said to be one, in its
    kind's words (what it promises alone, what a failover does)."""
    if len(names) > 1:
        return f"lock nodes: {', '.join(names)} (quorum {quorum} of {len(names)})"
    source = (
        "the broker's Redis, as redlock_nodes is not set"
        if from_broker
        else "the only node of redlock_nodes"
    )
    alone = specific_type(names[0]).words(names[0]).alone
    return f"lock node: {names[0]} ({source}): ONE node, {alone}"
