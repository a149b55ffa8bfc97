"""A PostgreSQL database as one lock node: its URL, its connections, and one
round of calls on several such nodes at once, bounded on the client's side.

psycopg's libpq object is driven non-blocking (every node's socket of the round
polled together until each answered or its deadline passed): a hung server
costs one timeout, never a hang, and nothing retries in the client. Connections
are plain autocommit sessions with no session state, so a transaction pooler
(pgbouncer ``pool_mode = transaction``) changes nothing; each prepares a lock's
acquire and release (a third of a call's time on the server) under a hash of
their text, and a pooler's "prepared statement does not exist" (nothing ran)
sends the call, and every later one to that node, unprepared.
"""

from __future__ import annotations

import hashlib
import re
import select
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import ProgrammingError

from ...exceptions import ConfigurationError
from ...exceptions import NodeError as _NodeError
from .. import cut_at, mask_url
from ..guard import FORKS, Breaker
from .schema import REVISION, VERSION, check_sql, install_sql
from .wire import json_value, redis_shaped, results_read

__all__ = ["NodeError", "PostgresNode", "gather"]

#: Idle connections kept per node and process.
MAX_IDLE = 8
_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,62}")

#: The reply to a call sent as a prepared statement its server connection lacks.
UNPREPARED = object()
_TUPLES_OK = pq.ExecStatus.TUPLES_OK


class NodeError(_NodeError):
    """A PostgreSQL node did not answer a call, or answered it with an error."""


#: What libpq says when a connection is refused for a reason that waiting does
#: not cure: the credentials, the database, the role, pg_hba, TLS verification.
_NO_HEALING = re.compile(
    r"authentication failed|no password supplied|password authentication|"
    r'(database|role) "[^"]*" does not exist|no pg_hba\.conf entry|'
    r"certificate verify failed|server certificate for|root certificate file",
    re.IGNORECASE,
)


def refused(name: str, message: str) -> NodeError:
    """A failed connect's error; one that cannot heal (see :data:`_NO_HEALING`) says so."""
    return NodeError(f"{name}: {message}", name, heals=not _NO_HEALING.search(message))


class PostgresNode:
    """One PostgreSQL database (a schema of its own in it) as a lock node.

    Args:
        url: ``postgresql://`` or ``postgres://``, libpq's URL with its query
            options (``sslmode``, ``application_name``...), plus ``schema``
            (default ``redlock``): where the node's tables live.
        timeout: seconds a call gets for its reply.
        min_replicas: > 0: each call's commit waits for a synchronous standby
            to apply it (``synchronous_commit = remote_apply``); refused where
            the server has no ``synchronous_standby_names``.
        connect_timeout: seconds a new connection gets to open; None: ``timeout``.
    """

    kind = "postgres"
    cluster = False

    def __init__(
        self, url: str, timeout: float, min_replicas: int = 0, connect_timeout: float | None = None
    ):
        self.name = mask_url(url)
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        schema = dict(query).get("schema", "redlock")
        if not _IDENT.fullmatch(schema):
            raise ConfigurationError(
                f"PostgreSQL node {self.name}: schema {schema!r} must be a lower-case SQL "
                "name (letters, digits, underscores)"
            )
        conninfo = urlunsplit(
            parts._replace(query=urlencode([q for q in query if q[0] != "schema"]))
        )
        try:
            params = conninfo_to_dict(conninfo)
        except ProgrammingError as exc:
            raise ConfigurationError(f"PostgreSQL node {self.name}: {exc}") from exc
        self.schema = schema
        self.conninfo = conninfo.encode()
        self.identity: tuple = (
            "postgres",
            params.get("host") or "localhost",
            int(params.get("port") or 5432),
            params.get("dbname") or params.get("user") or "",
            schema,
        )
        self.timeout = timeout
        self.min_replicas = min_replicas
        self.connect_timeout = connect_timeout
        self.run_sql = f"SELECT {schema}.run($1, $2, $3, $4)".encode()
        #: The two calls of every lock as statements of their own (see ``lease.sql``).
        self.acquire_sql = f"SELECT {schema}.acquire_plain($1, $2, $3, $4, $5, $6)".encode()
        self.release_sql = f"SELECT {schema}.release_plain($1, $2)".encode()
        #: Their names as prepared statements: one name, one text, whoever prepared it.
        self.statements = {
            sql: b"crl_" + hashlib.sha1(sql).hexdigest()[:16].encode()
            for sql in (self.acquire_sql, self.release_sql)
        }
        self.prepare_sql = "".join(
            f"PREPARE {name.decode()} AS {sql.decode()};" for sql, name in self.statements.items()
        )
        #: False once a pooler ran a call where its statements were not prepared.
        self.prepares = True
        self._idle: list[pq.abc.PGconn] = []
        self._forks = FORKS.count
        self._checked = False
        self.breaker = Breaker()  # on its connects

    def __repr__(self) -> str:
        return f"<PostgresNode {self.name}>"

    def members(self) -> list[PostgresNode]:
        """The servers a scan visits: this one."""
        return [self]

    # -- connections --------------------------------------------------------------------------

    def idle_connection(self) -> pq.abc.PGconn | None:
        if self._forks != FORKS.count:  # forked: the parent's sockets are not ours
            self._idle, self._forks, self._checked = [], FORKS.count, False
            self.breaker.forget()
        while self._idle:
            conn = self._idle.pop()
            if conn.status == pq.ConnStatus.OK:
                return conn
            conn.finish()
        return None

    def put_back(self, conn: pq.abc.PGconn) -> None:
        if len(self._idle) < MAX_IDLE and conn.status == pq.ConnStatus.OK:
            self._idle.append(conn)
        else:
            conn.finish()

    def skipped(self) -> NodeError | None:
        """An error while this node is skipped after a connect timed out, else None."""
        if self.breaker.skipping():
            return NodeError(self.breaker.why(self.name, "connects"))
        return None

    def close(self) -> None:
        while self._idle:
            self._idle.pop().finish()

    # -- the schema, checked on a process's first connection --------------------------------

    def check(self, conn: pq.abc.PGconn, deadline: float) -> Exception | None:
        """Check (or create) the schema on this node's first connection of the
        process: None when it is there at this version, else the error."""
        steps = self.checking(conn, deadline)
        try:
            sql, until = next(steps)
            while True:
                sql, until = steps.send(execute(conn, sql, until))
        except StopIteration as done:
            return done.value

    def checking(
        self, conn: pq.abc.PGconn, deadline: float
    ) -> Generator[tuple[str, float], Any, Exception | None]:
        """:meth:`check` as steps (the async calls drive them too): each yields the
        SQL to run and its deadline, and receives what :func:`execute` gives."""
        reply = yield check_sql(self.schema), deadline
        if isinstance(reply, Exception):
            return reply
        found, revision, standbys = reply
        # made here if missing; functions of an earlier revision are brought up to date
        if found is None or (found == VERSION and revision < REVISION):
            installed = yield install_sql(self.schema), max(deadline, time.monotonic() + 30)
            if isinstance(installed, TimeoutError) or conn.status != pq.ConnStatus.OK:
                return installed  # an outage while creating it: the next connect tries again
            if isinstance(installed, Exception):
                doing = (
                    f"create schema {self.schema!r}"
                    if found is None
                    else f"update schema {self.schema!r} (its functions are at revision "
                    f"{revision}, this celery_redlock needs {REVISION})"
                )
                return NodeError(
                    f"PostgreSQL node {self.name}: cannot {doing} ({installed}); "
                    "run `celery redlock schema --apply` as a role that may, "
                    "or apply the SQL `celery redlock schema` prints",
                    self.name,
                    heals=False,
                )
        elif found != VERSION:
            return NodeError(
                f"PostgreSQL node {self.name}: schema {self.schema!r} is at version {found}, "
                f"this celery_redlock needs {VERSION}; run `celery redlock schema --apply`",
                self.name,
                heals=False,
            )
        if self.min_replicas and not standbys:
            return NodeError(
                f"PostgreSQL node {self.name}: redlock_min_replicas={self.min_replicas} needs "
                "a synchronous standby (synchronous_standby_names is empty on the server)",
                self.name,
                heals=False,
            )
        self._checked = True
        return None


def reply_of(result: Any, name: str) -> Any:
    """The JSON of a call's one value (its first result), or its error."""
    if result is None:
        return NodeError(f"{name}: no result")
    if result.status != _TUPLES_OK:
        if result.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":  # no such statement
            return UNPREPARED
        message = (result.error_message or b"").decode(errors="replace").strip()
        return NodeError(f"{name}: {message or pq.ExecStatus(result.status).name}")
    raw = result.get_value(0, 0)
    return None if raw is None else json_value(raw)


class _Call:
    """One node's part of a round: connect (if need be), send, read."""

    __slots__ = (
        "node", "conn", "sql", "params", "reply", "results", "state", "deadline", "want", "reused"
    )  # fmt: skip

    def __init__(self, node: PostgresNode, sql: bytes, params: list[bytes | None]):
        self.node, self.sql, self.params = node, sql, params
        self.conn: Any = None
        self.reply: Any = None
        self.results: list[Any] = []  # of the call being read
        self.state = "done"  # connect -> send -> read -> ok, or done with an error
        self.deadline = 0.0
        self.want = select.POLLOUT
        self.reused = False  # on an idle connection, which the server may have closed since


def gather(
    nodes: Sequence[PostgresNode],
    queries: Sequence[tuple[bytes, list[bytes | None]]],
    timeout: float,
    post: Callable[[Any], Any] = redis_shaped,
    needed: int | None = None,
) -> list[Any]:
    """Run ``queries[i]`` on ``nodes[i]``, all at once: each one's reply (its
    one value, read as JSON and passed through ``post``) or an exception. Once
    ``needed`` nodes answered, a call still connecting or unanswered is "not
    answering": its connection is closed (a statement sent there commits or
    not, as for any node that did not answer)."""
    now = time.monotonic()
    calls = [_Call(node, sql, params) for node, (sql, params) in zip(nodes, queries)]
    for call in calls:
        node = call.node
        call.conn = node.idle_connection()
        if call.conn is not None:
            call.reused = True
            _send(call, now + timeout)
            continue
        call.reply = node.skipped()
        if call.reply is None:
            _connect(call, now, timeout)
    _drive(calls, timeout, needed)
    return [post(c.reply) if c.state == "ok" else c.reply for c in calls]


def _connect(call: _Call, now: float, timeout: float) -> None:
    node = call.node
    try:
        call.conn = pq.PGconn.connect_start(node.conninfo)
        call.conn.nonblocking = 1
    except Exception as exc:  # noqa: BLE001 - libpq could not even start
        call.conn = None
        call.reply, call.state = NodeError(f"{node.name}: {exc}"), "done"
        return
    call.state, call.deadline = "connect", now + (node.connect_timeout or timeout)
    call.want = select.POLLOUT


def _broken(call: _Call, error: Exception, timeout: float) -> None:
    """A connection that broke: once, where it was an idle one (the server
    restarted, or closed it), the call goes again on a new connection; the
    operations are safe to send twice."""
    if call.reused and call.conn is not None and call.conn.status != pq.ConnStatus.OK:
        call.conn.finish()
        call.reused = False
        _connect(call, time.monotonic(), timeout)
        return
    _fail(call, error)


def _send(call: _Call, deadline: float) -> None:
    try:
        name = call.node.statements.get(call.sql) if call.node.prepares else None
        if name is None:
            call.conn.send_query_params(call.sql, call.params)
        else:
            call.conn.send_query_prepared(name, call.params)
    except Exception as exc:  # noqa: BLE001 - a broken connection
        _broken(call, NodeError(f"{call.node.name}: {exc}"), deadline - time.monotonic())
        return
    call.results = []
    call.state, call.deadline, call.want = "send", deadline, select.POLLOUT
    _step(call, 0, time.monotonic())


def _fail(call: _Call, error: Exception) -> None:
    if call.conn is not None:
        call.conn.finish()
        call.conn = None
    call.reply, call.state = error, "done"


def _step(call: _Call, timeout: float, now: float) -> None:
    """Move ``call`` on as far as its socket allows without waiting."""
    conn = call.conn
    try:
        if call.state == "connect":
            status = conn.connect_poll()
            if status == pq.PollingStatus.FAILED:
                message = conn.get_error_message().strip()
                _fail(call, refused(call.node.name, message or "cannot connect"))
                return
            if status != pq.PollingStatus.OK:
                call.want = select.POLLIN if status == pq.PollingStatus.READING else select.POLLOUT
                return
            node = call.node
            budget = node.connect_timeout or timeout
            if not node._checked:  # part of the connection's set-up: the connect budget
                problem = node.check(conn, time.monotonic() + budget)
                if problem is not None:
                    _fail(call, problem)
                    return
            if node.prepares:  # as is preparing the statements
                prepared = execute(conn, node.prepare_sql, time.monotonic() + budget)
                if isinstance(prepared, TimeoutError):
                    _fail(call, TimeoutError(f"{node.name}: no connect in {budget:g}s"))
                    return
                # refused (a pooler's server connection had them already, say): unprepared
                node.prepares = not isinstance(prepared, Exception)
            node.breaker.answered()
            # the reply's timeout starts now: the connect (and a first use's
            # schema creation) had budgets of their own
            _send(call, time.monotonic() + timeout)
            return
        if call.state == "send":
            if conn.flush() != 0:
                return
            call.state, call.want = "read", select.POLLIN
        if call.state == "read":
            if not results_read(conn, call.results):
                return
            call.reply = reply_of(call.results[0] if call.results else None, call.node.name)
            if call.reply is UNPREPARED:  # nothing ran: again, unprepared from now on
                call.node.prepares = False
                _send(call, call.deadline)
                return
            if isinstance(call.reply, Exception) and conn.status != pq.ConnStatus.OK:
                _broken(call, call.reply, timeout)
                return
            call.state = "done" if isinstance(call.reply, Exception) else "ok"
            call.node.put_back(conn)
            call.conn = None
    except Exception as exc:  # noqa: BLE001 - the connection broke under us
        _broken(call, NodeError(f"{call.node.name}: {exc}"), timeout)


def _drive(calls: list[_Call], timeout: float, needed: int | None = None) -> None:
    """Poll every pending call's socket until each is done or past its deadline;
    once ``needed`` calls answered, the others until :func:`.cut_at` at most."""
    started = time.monotonic()
    until: float | None = None
    while True:
        now = time.monotonic()
        if until is None and needed is not None and sum(c.state == "ok" for c in calls) >= needed:
            until = cut_at(started, now, timeout)
        poller = select.poll()
        waiting: list[_Call] = []
        for call in calls:
            if call.state not in ("connect", "send", "read"):
                continue
            if until is not None and now >= until:
                why = "connected" if call.state == "connect" else "answered"
                _fail(call, TimeoutError(f"{call.node.name}: not {why} by the time a quorum did"))
                continue
            if now >= call.deadline:
                if call.state == "connect":
                    call.node.breaker.timed_out(call.node.connect_timeout or timeout)
                why = "connect" if call.state == "connect" else "reply"
                _fail(call, TimeoutError(f"{call.node.name}: no {why} in {timeout:g}s"))
                continue
            poller.register(call.conn.socket, call.want)
            waiting.append(call)
        if not waiting:
            return
        end = min(c.deadline for c in waiting)
        if until is not None:
            end = min(end, until)
        ready = {fd for fd, _ in poller.poll(max(end - now, 0.0) * 1000 + 1)}
        now = time.monotonic()
        for call in waiting:
            if call.conn is not None and call.conn.socket in ready:
                _step(call, timeout, now)


def execute(conn: Any, sql: str, deadline: float) -> Any:
    """Run ``sql`` (one or more statements) on ``conn`` and wait for it until
    ``deadline``: the last statement's first value as JSON, or the error."""
    results: list[Any] = []
    try:
        conn.send_query(sql.encode())
        while conn.flush() != 0:
            if not _wait(conn, select.POLLOUT, deadline):
                return TimeoutError("no reply in time")
        while not results_read(conn, results):
            if not _wait(conn, select.POLLIN, deadline):
                return TimeoutError("no reply in time")
    except Exception as exc:  # noqa: BLE001 - the connection broke
        return NodeError(str(exc))
    return last_value(results)


def last_value(results: list[Any]) -> Any:
    """The last statement's first value as JSON (None without one), or the error."""
    last = None
    for res in results:
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            last = NodeError((res.error_message or b"").decode(errors="replace").strip())
        elif not isinstance(last, Exception):
            last = res
    if isinstance(last, Exception) or last is None or not last.ntuples:
        return last
    raw = last.get_value(0, 0)
    return None if raw is None else json_value(raw)


def _wait(conn: Any, event: int, deadline: float) -> bool:
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    poller = select.poll()
    poller.register(conn.socket, event)
    return bool(poller.poll(left * 1000))
