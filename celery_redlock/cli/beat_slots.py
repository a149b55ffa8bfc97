"""``celery redlock beat-slots``: the beat slot claims, newest first."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import click

from .. import conf
from .._format import glob_escape, plural, printable, slot_number, slot_time, ttl_text
from .._reading import OWNER, connect
from .base import LIMIT, Unavailable, command
from .listing import Listing

__all__ = ["beat_slots"]


@command("beat-slots", click.argument("entry", required=False), LIMIT)
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
        listing = Listing(client, "beat", tail, limit)
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
