"""The health rules of ``celery redlock nodes``: what in a node's answers can break a lock."""

from __future__ import annotations

from collections.abc import Sequence

from ._format import ms_text
from .core import NodeInfo
from .core.nodes import kind_timeouts

__all__ = ["SAFE_POLICIES", "findings", "node_row"]

#: ``maxmemory-policy`` values that never evict a key. ``volatile-*`` policies
#: evict keys with a TTL, which is every lock; ``allkeys-*`` evict anything.
SAFE_POLICIES = ("noeviction",)


def node_row(info: NodeInfo) -> list[str]:
    """The row of the ``nodes`` table."""
    if info.error is not None:
        return [info.node, "DOWN", "-", "-", "-", "-"]
    policy = info.maxmemory_policy
    policy_cell = (
        policy if policy in SAFE_POLICIES or info.kind != "redis" else f"{policy} (UNSAFE)"
    )
    persistence = "-" if info.aof is None else "aof off"
    if info.aof:
        persistence = f"aof, fsync {info.appendfsync or '?'}"
    return [info.node, ms_text(info.latency), info.version, info.role, policy_cell, persistence]


def findings(
    infos: Sequence[NodeInfo], node_timeout: float | None, min_replicas: int = 0
) -> list[str]:
    """The DOWN, WARNING and note lines of ``nodes``; one line per finding, naming its
    nodes. ``node_timeout`` None: each node's kind's default."""
    found: dict[tuple[str, str], list[str]] = {}  # (level, message) -> node names, in order

    def add(level: str, node: str, message: str) -> None:
        found.setdefault((level, message), []).append(node)

    seen_run_ids: dict[str, str] = {}
    for p in infos:
        if p.error is not None:
            add("DOWN", p.node, p.error)
            continue
        if p.kind == "redis" and p.maxmemory_policy not in SAFE_POLICIES:
            why = (
                "evicts keys with a TTL, which is every lock"
                if p.maxmemory_policy.startswith("volatile-")
                else "may evict any key, locks included"
            )
            limit = "" if p.maxmemory else " (maxmemory is 0 now: it starts once a limit is set)"
            add(
                "WARNING",
                p.node,
                f"maxmemory-policy {p.maxmemory_policy} {why}: a held lock can vanish under "
                f"memory pressure and a second execution start{limit}. Set maxmemory-policy "
                "noeviction.",
            )
        if p.role not in ("master", "primary", "?"):
            add(
                "WARNING",
                p.node,
                f"role {p.role}: lock nodes must be independent masters (a replica refuses "
                "writes; a failover to one loses recent locks).",
            )
        if p.role in ("master", "primary") and p.replicas is not None:
            if p.replicas < min_replicas:
                add(
                    "WARNING",
                    p.node,
                    f"{_replicas(p.replicas)} connected, redlock_min_replicas is "
                    f"{min_replicas}: no write here can be confirmed, so the node never "
                    "counts toward a quorum.",
                )
            elif p.replicas and not min_replicas:
                add(
                    "note",
                    p.node,
                    f"{_replicas(p.replicas)} and redlock_min_replicas 0: a failover may "
                    "promote a replica that never saw a held lock; redlock_min_replicas=1 "
                    "makes each grant wait for one to confirm it.",
                )
        if p.run_id:
            other = seen_run_ids.setdefault(p.run_id, p.node)
            if other != p.node:
                add(
                    "WARNING",
                    p.node,
                    f"same server as {other} (run_id {p.run_id}): one server counted twice "
                    "breaks the quorum arithmetic.",
                )
        bound = node_timeout if node_timeout is not None else kind_timeouts(p.kind)[0]
        if p.latency > bound:
            add(
                "WARNING",
                p.node,
                f"answers in {ms_text(p.latency)}, slower than redlock_node_timeout "
                f"({ms_text(bound)}): the workers count it as down.",
            )
        if p.aof is False:
            add(
                "note",
                p.node,
                "no AOF: a restart forgets the locks a node held; keep a restarted node out "
                "for longer than the longest lock TTL, or run appendonly yes.",
            )
        elif p.aof and p.appendfsync not in ("always", None):
            add(
                "note",
                p.node,
                f"appendfsync {p.appendfsync}: a crash may lose the last writes (up to about a "
                "second); appendfsync always closes that window.",
            )
    order = {"DOWN": 0, "WARNING": 1, "note": 2}
    return [
        f"{level:<7} {', '.join(names)}: {message}"
        for (level, message), names in sorted(found.items(), key=lambda item: order[item[0][0]])
    ]


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"
