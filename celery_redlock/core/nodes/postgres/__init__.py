"""The PostgreSQL kind of lock node: ``postgresql://`` (or ``postgres://``) URLs.

One database is one lock node. Its keys live in a table of a schema of its
own, with Redis's semantics (strings, hashes, sorted sets; expiry on the
server's clock, ``clock_timestamp()``), and each operation is a PL/pgSQL
function written as the Lua script of the same name
(:mod:`celery_redlock.core.nodes.scripts`), so it answers with the same values. A
call is one statement in its own transaction, which first takes a
transaction-scoped advisory lock on each of its keys: the calls on one key
run one after another, as scripts do on Redis. The two calls of every lock
(an acquire no gate applies to, a plain release) have functions of their own
with scalar arguments, prepared on each connection; every other call goes
through ``run(op, keys, args)``. See :mod:`.node` for the connections and
:mod:`.schema` for the SQL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ...records import NodeInfo, PostgresInfo
from ...values import error_text
from .. import glob_regex, ping_latency
from ..codec import Call
from ..kind import Kind
from .node import NodeError, PostgresNode, execute, gather
from .schema import ddl, install_sql
from .wire import text_array

__all__ = [
    "CONNECT_TIMEOUT",
    "KIND",
    "NODE_TIMEOUT",
    "SCHEMES",
    "PostgresKind",
    "PostgresNode",
    "accepts",
    "command",
    "ddl",
    "install",
    "make",
    "run",
]

#: The URL schemes of a PostgreSQL node.
SCHEMES = ("postgresql", "postgres")
#: Seconds a call gets by default: a call is a commit, which waits for the WAL
#: flush, on a server often shared with the application. Measured beside two
#: busy loops on a 2-core host, fsync on (``benchmarks/call_times.py``): 0.3 ms
#: typical, 91 ms the longest seen in 12,000; 250 ms leaves a checkpoint's
#: stall room too.
NODE_TIMEOUT = 0.25
#: Seconds a new connection gets by default (TCP, TLS, authentication and, on a
#: process's first connection, the schema's check).
CONNECT_TIMEOUT = 1.0


def make(
    spec: Any, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
) -> PostgresNode:
    return PostgresNode(spec, timeout, min_replicas, connect_timeout)


def accepts(spec: Any) -> bool:
    """No client object: a PostgreSQL node is given by its URL."""
    return False


def run(
    call: Call, nodes: Sequence[PostgresNode], timeout: float, needed: int | None = None
) -> list[Any]:
    """One round of ``call`` on ``nodes``: one statement each, all at once (ended
    once ``needed`` answered, if given)."""
    return gather(nodes, statements(call, nodes), timeout, needed=needed)


def statements(call: Call, nodes: Sequence[PostgresNode]) -> list[tuple[Any, list[Any]]]:
    """Each node's statement of ``call`` and its parameters (the sync and the async calls')."""
    script, keys, args = call
    # a lock's acquire that no gate applies to and its plain release have statements
    # of their own; a replicated call sets its commit's wait in run(): the general one
    own = _OWN.get((script.name, len(keys), len(args)))
    if own is not None and not any(node.min_replicas for node in nodes):
        params = [v.encode() if v.__class__ is str else _text(v).encode() for v in (*keys, *args)]
        return [(getattr(node, own), params) for node in nodes]
    params = [script.name.encode(), text_array(keys), text_array(args)]
    return [(node.run_sql, [*params, b"t" if node.min_replicas else b"f"]) for node in nodes]


#: (script, KEYS, ARGV) -> the node's attribute holding the statement of its own.
_OWN = {("acquire", 2, 4): "acquire_sql", ("release", 1, 1): "release_sql"}


def send(op: Any, nodes: Sequence[PostgresNode], keys: Any, args: Any) -> list[int]:
    """Nothing goes unwaited to PostgreSQL (a statement's reply is read on the
    connection that sent it): every node is left to an ordinary round."""
    return list(range(len(nodes)))


# -- plain reads -----------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _score(value: Any) -> bytes:
    f = float(value)
    return (str(int(f)) if f.is_integer() else repr(f)).encode()


def _command(schema: str, cmd: tuple) -> tuple[str, list[Any], Callable[[Any], Any] | None]:
    """(SQL returning one JSON value, its parameters, a reshaping of the reply) for ``cmd``."""
    verb, *rest = cmd
    verb = _text(verb).upper()
    alive = "(expires_at IS NULL OR expires_at > clock_timestamp())"
    if verb == "PING":
        return "SELECT to_jsonb('PONG'::text)", [], None
    if verb == "GET":
        return f"SELECT to_jsonb({schema}.r_get($1))", rest[:1], None
    if verb == "PTTL":
        return f"SELECT to_jsonb({schema}.r_pttl($1))", rest[:1], None
    if verb == "TYPE":
        kind = f"(SELECT kind FROM {schema}.live($1))"
        sql = f"SELECT to_jsonb(CASE {kind} WHEN 's' THEN 'string' WHEN 'h' THEN 'hash' "
        return sql + "WHEN 'z' THEN 'zset' ELSE 'none' END)", rest[:1], None
    if verb == "DEL":
        return f"SELECT to_jsonb({schema}.r_del(VARIADIC $1::text[]))", [rest], None
    if verb == "HGETALL":
        sql = (
            "SELECT coalesce(jsonb_agg(x), '[]') FROM "
            f"jsonb_each_text(({schema}.typed($1, 'h')).map) e, "
            "LATERAL (VALUES (e.key), (e.value)) v(x)"
        )
        return sql, rest[:1], None
    if verb == "ZRANGE" and [_text(r).upper() for r in rest[1:]] == ["0", "-1", "WITHSCORES"]:
        sql = (
            "SELECT coalesce(jsonb_agg(jsonb_build_array(member, score)), '[]') "
            f"FROM {schema}.zmembers($1)"
        )
        return sql, rest[:1], lambda pairs: [x for m, s in pairs for x in (m.encode(), _score(s))]
    if verb == "SET" and len(rest) == 5 and [_text(r).upper() for r in rest[2:4]] == ["NX", "PX"]:
        return f"SELECT {schema}.set_nx($1, $2, $3::bigint)", [rest[0], rest[1], rest[4]], None
    if verb == "SCAN" and len(rest) == 5:
        cursor, count = int(_text(rest[0])), int(_text(rest[4]))
        sql = (
            f"SELECT coalesce(jsonb_agg(key), '[]') FROM (SELECT key FROM {schema}.kv "
            f'WHERE key ~ $1 AND {alive} ORDER BY key COLLATE "C" OFFSET {cursor} LIMIT {count}) x'
        )

        def page(keys: list) -> list:
            after = cursor + len(keys) if len(keys) == count else 0
            return [str(after).encode(), [k.encode() for k in keys]]

        return sql, ["^" + glob_regex(_text(rest[2])) + "$"], page
    raise NodeError(f"the PostgreSQL node does not answer {verb}")


def command(
    nodes: Sequence[PostgresNode], cmd: tuple, timeout: float, needed: int | None = None
) -> list[Any]:
    """The plain read ``cmd`` on ``nodes``, with Redis's reply shapes."""
    try:
        shaped = [_command(node.schema, cmd) for node in nodes]
    except NodeError as exc:
        return [exc] * len(nodes)
    queries: list[tuple[bytes, list[bytes | None]]] = [
        (sql.encode(), [text_array(p) if isinstance(p, list) else _text(p).encode() for p in ps])
        for sql, ps, _ in shaped
    ]
    reshape = shaped[0][2] if shaped else None
    from .wire import redis_shaped

    replies = gather(nodes, queries, timeout, post=lambda r: r, needed=needed)
    return [
        r if isinstance(r, Exception) else reshape(r) if reshape else redis_shaped(r)
        for r in replies
    ]


# -- the operator's view ---------------------------------------------------------------------


def node_info(
    node: PostgresNode, ask: Callable[[tuple, Sequence[Any]], list[Any]]
) -> list[NodeInfo]:
    """How ``node`` is: PING latency (the second one), version, role, standbys, and
    the settings a commit's durability rests on, as the node's session sees them
    (a role's or database's own ``synchronous_commit`` included)."""
    latency, down = ping_latency(node, ask)
    if down is not None:
        return [NodeInfo(node.name, error_text(down), latency, kind="postgres")]
    settings = ", ".join(f"current_setting('{name}')" for name in _DURABILITY)
    sql = (
        "SELECT jsonb_build_array(current_setting('server_version'), pg_is_in_recovery(), "
        f"(SELECT count(*) FROM pg_stat_replication), {settings})"
    )
    reply = gather([node], [(sql.encode(), [])], node.timeout, post=lambda r: r)[0]
    if isinstance(reply, Exception):
        return [NodeInfo(node.name, error_text(reply), latency, kind="postgres")]
    version, standby, replicas, *durability = reply
    # copies of one data directory share a system identifier; its start time tells
    # them apart. A managed server may deny it: then no "same server" check.
    ident = (
        "SELECT jsonb_build_array(system_identifier || ' started ' || "
        "pg_postmaster_start_time()) FROM pg_control_system()"
    )
    server = gather([node], [(ident.encode(), [])], node.timeout, post=lambda r: r)[0]
    return [
        NodeInfo(
            node.name,
            None,
            latency,
            f"postgresql {version}",
            "standby" if standby else "primary",
            replicas,
            kind="postgres",
            server_id=None if isinstance(server, Exception) else server[0],
            specific=PostgresInfo(*durability),
        )
    ]


#: The settings of :class:`~celery_redlock.core.records.PostgresInfo`, in its order.
_DURABILITY = ("fsync", "synchronous_commit", "full_page_writes", "synchronous_standby_names")


def install(node: PostgresNode, timeout: float = 30.0) -> None:
    """Create (or bring up to date) ``node``'s schema now.

    Raises:
        NodeError: the server refused it (say, the role may not create it).
    """
    from psycopg import pq

    conn = pq.PGconn.connect(node.conninfo)
    try:
        if conn.status != pq.ConnStatus.OK:
            raise NodeError(f"{node.name}: {conn.get_error_message().strip()}")
        conn.nonblocking = 1
        done = execute(conn, install_sql(node.schema), time.monotonic() + timeout)
        if isinstance(done, Exception):
            raise NodeError(f"{node.name}: {done}")
    finally:
        conn.finish()


class PostgresKind(Kind):
    """PostgreSQL databases as lock nodes: the module's functions, which mypy
    checks against :class:`Kind` here."""

    schemes = SCHEMES
    has_schema = True
    node_timeout = NODE_TIMEOUT
    connect_timeout = CONNECT_TIMEOUT
    make = staticmethod(make)
    run = staticmethod(run)
    command = staticmethod(command)
    node_info = staticmethod(node_info)
    ddl = staticmethod(ddl)
    install = staticmethod(install)


#: The PostgreSQL kind.
KIND = PostgresKind()
