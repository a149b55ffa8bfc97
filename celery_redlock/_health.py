"""The health rules of ``celery redlock nodes`` and the dashboard: what in a node's
answers can break a lock, in its own kind's words."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from ._format import ms_text, plural
from .core import (
    EtcdInfo,
    KindWords,
    NodeInfo,
    PostgresInfo,
    RedisInfo,
    ZookeeperInfo,
    kind_timeouts,
)

__all__ = ["HEADER", "SAFE_POLICIES", "Check", "checks", "findings", "node_row"]

#: ``maxmemory-policy`` values that never evict a key. ``volatile-*`` policies
#: evict keys with a TTL, which is every lock; ``allkeys-*`` evict anything.
SAFE_POLICIES = ("noeviction",)

#: The header of the ``nodes`` table (:func:`node_row`).
HEADER = ["NODE", "PING", "VERSION", "ROLE", "DURABILITY"]

Add = Callable[[str, str, str], None]


class Check(NamedTuple):
    """One setting of a node that a lock's safety rests on, and whether it breaks it."""

    label: str
    value: str
    unsafe: bool = False

    def __str__(self) -> str:
        return f"{self.label} {self.value}" + (" (UNSAFE)" if self.unsafe else "")


def checks(info: NodeInfo) -> list[Check]:
    """The settings of ``info``'s kind that apply to it (none for a node that is down)."""
    p = info.specific
    if isinstance(p, RedisInfo):
        policy = p.maxmemory_policy
        out = [Check("maxmemory-policy", policy, policy not in SAFE_POLICIES)]
        if p.maxmemory:
            out.append(Check("maxmemory", f"{p.maxmemory / 1048576:.0f} MiB"))
        if p.aof is not None:
            out.append(Check("aof", f"on, appendfsync {p.appendfsync or '?'}" if p.aof else "off"))
        return out
    if isinstance(p, PostgresInfo):
        return [
            Check("fsync", p.fsync, p.fsync == "off"),
            Check("synchronous_commit", p.synchronous_commit, p.synchronous_commit == "off"),
            Check("full_page_writes", p.full_page_writes, p.full_page_writes == "off"),
        ]
    if isinstance(p, EtcdInfo):
        return [
            Check("members", f"{p.members} (quorum {p.quorum})", p.members < 2),
            Check("leader", p.leader or "none", p.leader is None),
        ]
    if isinstance(p, ZookeeperInfo):
        known = p.answering > 0
        return [
            Check("members", f"{p.members} (quorum {p.quorum})", p.members < 2),
            Check("leader", p.leader or ("none" if known else "? (srvr refused)"),
                  known and p.leader is None),
        ]  # fmt: skip
    return []


def node_row(info: NodeInfo) -> list[str]:
    """The row of the ``nodes`` table (:data:`HEADER`)."""
    if info.error is not None:
        return [info.node, "DOWN", "-", "-", "-"]
    durability = ", ".join(str(c) for c in checks(info)) or "-"
    return [info.node, ms_text(info.latency), info.version, info.role, durability]


def findings(
    infos: Sequence[NodeInfo], node_timeout: float | None, min_replicas: int = 0
) -> list[str]:
    """The DOWN, WARNING and note lines of ``nodes``; one line per finding, naming its
    nodes. ``node_timeout`` None: each node's kind's default."""
    found: dict[tuple[str, str], list[str]] = {}  # (level, message) -> node names, in order

    def add(level: str, node: str, message: str) -> None:
        found.setdefault((level, message), []).append(node)

    seen_servers: dict[str, str] = {}
    for p in infos:
        if p.error is not None:
            add("DOWN", p.node, p.error)
            continue
        if isinstance(p.specific, RedisInfo):
            _redis(p, p.specific, add)
        elif isinstance(p.specific, PostgresInfo):
            _postgres(p, p.specific, add)
        elif isinstance(p.specific, EtcdInfo):
            _etcd(p, p.specific, add)
        elif isinstance(p.specific, ZookeeperInfo):
            _zookeeper(p, p.specific, add)
        if p.replicas is not None and p.role in ("master", "primary"):
            _replicas(p, min_replicas, add)
        if p.server_id:
            other = seen_servers.setdefault(p.server_id, p.node)
            if other != p.node:
                add(
                    "WARNING",
                    p.node,
                    f"same server as {other} ({_words(p).identity} {p.server_id}): "
                    "one server counted twice breaks the quorum arithmetic.",
                )
        bound = node_timeout if node_timeout is not None else kind_timeouts(p.kind)[0]
        if p.latency > bound:
            add(
                "WARNING",
                p.node,
                f"answers in {ms_text(p.latency)}, slower than redlock_node_timeout "
                f"({ms_text(bound)}): the workers count it as down.",
            )
    order = {"DOWN": 0, "WARNING": 1, "note": 2}
    return [
        f"{level:<7} {', '.join(names)}: {message}"
        for (level, message), names in sorted(found.items(), key=lambda item: order[item[0][0]])
    ]


def _redis(p: NodeInfo, r: RedisInfo, add: Add) -> None:
    if r.maxmemory_policy not in SAFE_POLICIES:
        why = (
            "evicts keys with a TTL, which is every lock"
            if r.maxmemory_policy.startswith("volatile-")
            else "may evict any key, locks included"
        )
        limit = "" if r.maxmemory else " (maxmemory is 0 now: it starts once a limit is set)"
        add(
            "WARNING",
            p.node,
            f"maxmemory-policy {r.maxmemory_policy} {why}: a held lock can vanish under "
            f"memory pressure and a second execution start{limit}. Set maxmemory-policy "
            "noeviction.",
        )
    if p.role not in ("master", "?"):
        add(
            "WARNING",
            p.node,
            f"role {p.role}: lock nodes must be independent masters (a replica refuses "
            "writes; a failover to one loses recent locks).",
        )
    if r.aof is False:
        add(
            "note",
            p.node,
            "no AOF: a restart forgets the locks a node held; keep a restarted node out "
            "for longer than the longest lock TTL, or run appendonly yes.",
        )
    elif r.aof and r.appendfsync not in ("always", None):
        add(
            "note",
            p.node,
            f"appendfsync {r.appendfsync}: a crash may lose the last writes (up to about a "
            "second); appendfsync always closes that window.",
        )


def _postgres(p: NodeInfo, pg: PostgresInfo, add: Add) -> None:
    if p.role == "standby":
        add(
            "WARNING",
            p.node,
            "a standby: it refuses writes, so no lock can be taken there; name the primary.",
        )
    if pg.fsync == "off":
        add(
            "WARNING",
            p.node,
            "fsync off: a crash of the server (not of PostgreSQL alone) can lose or corrupt "
            "held locks and fence values, so a second holder or a smaller token may follow. "
            "Set fsync = on.",
        )
    if pg.full_page_writes == "off":
        add(
            "WARNING",
            p.node,
            "full_page_writes off: a crash in the middle of a page write can corrupt the "
            "lock table. Set full_page_writes = on.",
        )
    if pg.synchronous_commit == "off":
        add(
            "WARNING",
            p.node,
            "synchronous_commit off: a grant is acknowledged before it is on disk, so a "
            "crash forgets the last grants while their tasks run (a second holder may "
            "follow). Set synchronous_commit = on for the node's role or database.",
        )


def _one_server(p: NodeInfo, members: int, group: str, add: Add) -> bool:
    """Warn of a ``group`` (cluster, ensemble) of one member; whether it is one."""
    if members < 2:
        add(
            "WARNING",
            p.node,
            f"{plural(members, 'member')}: the {group} is one server, so the locks are only "
            "as safe as it (no member may fail); run 3 or 5 members.",
        )
    return members < 2


def _etcd(p: NodeInfo, e: EtcdInfo, add: Add) -> None:
    if not _one_server(p, e.members, "cluster", add) and e.members % 2 == 0:
        add(
            "note",
            p.node,
            f"{e.members} members need {e.quorum} for a write: no more failures to spare "
            f"than {e.members - 1} members give.",
        )
    if e.leader is None:
        add(
            "WARNING",
            p.node,
            "no leader: the cluster takes no write until its members elect one.",
        )


def _zookeeper(p: NodeInfo, z: ZookeeperInfo, add: Add) -> None:
    _one_server(p, z.members, "ensemble", add)
    down = [h for h, mode in z.modes if mode == "down"]
    if down and z.members - len(down) < z.quorum:
        add("WARNING", p.node, f"{len(down)} of {z.members} members down: no quorum, no write.")
    elif down:
        add(
            "note",
            p.node,
            f"member(s) {', '.join(down)} down: {z.members - len(down)} left for a quorum "
            f"of {z.quorum}.",
        )
    if z.answering and z.leader is None:
        add("WARNING", p.node, "no leader: the ensemble takes no write until it elects one.")
    elif not z.answering and not down:
        add(
            "note",
            p.node,
            "the members refuse the srvr four-letter word (4lw.commands.whitelist): "
            "their modes are unknown.",
        )


def _words(p: NodeInfo) -> KindWords:
    """``p``'s kind's words (the defaults, a replica's, for a node that said nothing)."""
    return p.specific.words(p.node) if p.specific is not None else KindWords()


def _replicas(p: NodeInfo, min_replicas: int, add: Add) -> None:
    replicas = p.replicas or 0
    words = _words(p)
    noun = words.copy
    count = plural(replicas, noun)
    if replicas < min_replicas:
        add(
            "WARNING",
            p.node,
            f"{count} connected, redlock_min_replicas is {min_replicas}: no write here can "
            "be confirmed, so the node never counts toward a quorum.",
        )
    elif replicas and not min_replicas:
        fix = words.copy_wait
        add(
            "note",
            p.node,
            f"{count} and redlock_min_replicas 0: a failover may promote a {noun} that "
            f"never saw a held lock; redlock_min_replicas=1 {fix}.",
        )
