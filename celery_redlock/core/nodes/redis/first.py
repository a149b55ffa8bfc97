"""The one-``SET NX`` fast path: the Redis kind's own way of running an acquire
(and a new claim) on plain masters.

On a free key, the first step of ``ACQUIRE`` without fencing and without gates,
and of ``CLAIM_NEXT`` without a take-over, is ``SET KEYS[1] ARGV[1] NX PX
ARGV[2]``, and the script's reply is then known. On plain masters (no cluster
routing, no replica to confirm a write: no ``WAIT`` behind it) that step goes
as the bare command, without the script's cost on the node, and only a node
that refuses it (the key is taken, or already holds ``ARGV[1]``: a re-sent
call) runs the script, in a second round, to say by whom or to treat it as
its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import scripts
from ...scripts import Script
from .rounds import gather, run_script

__all__ = ["run"]

#: The scripts that begin with the bare step, and their ARGV[3] when they do: an
#: acquire with no fence value to move (and no gates: two KEYS), a claim taking
#: nothing over.
_FIRST = {scripts.ACQUIRE: "", scripts.CLAIM_NEXT: ""}


def run(
    op: Script,
    nodes: Sequence[Any],
    keys: Sequence[str],
    args: Sequence[Any],
    timeout: float,
    needed: int | None = None,
) -> list[Any]:
    """:func:`.rounds.run_script` of the script ``op`` (the kind protocol's ``run``), by
    the bare ``SET NX`` first where it applies (a round decided once ``needed`` nodes
    answered, if given)."""
    if op not in _FIRST or args[2] != _FIRST[op]:  # a fenced acquire, a release: the script
        return run_script(op, nodes, keys, args, timeout, needed)
    won: list = [1] if op is scripts.ACQUIRE else [1, None, 0]
    if len(keys) != 1 + (op is scripts.ACQUIRE) or any(
        node.cluster or node.min_replicas for node in nodes
    ):
        return run_script(op, nodes, keys, args, timeout, needed)
    first = gather(nodes, ("SET", keys[0], args[0], "NX", "PX", args[1]), timeout, needed=needed)
    replies = [r if r is None or isinstance(r, Exception) else list(won) for r in first]
    refused = [i for i, r in enumerate(replies) if r is None]
    if refused:
        again = run_script(op, [nodes[i] for i in refused], keys, args, timeout)
        for i, reply in zip(refused, again):
            replies[i] = reply
    return replies
