"""The lean wire path of :func:`celery_redlock.core.nodes.redis.rounds.gather`: RESP encoder, RESP2
parser, and rounds against a scripted in-process peer (a peer that closes
mid-reply, garbage). The rounds on real redis-server nodes are in
``tests/core/integration/test_nodes_wire_live.py``."""

from __future__ import annotations

import socket
import threading
import time

import fakeredis
import pytest
import redis
from redis.exceptions import (
    BusyLoadingError,
    DataError,
    InvalidResponse,
    NoScriptError,
    ResponseError,
)

from celery_redlock.core.nodes.redis.node import Node
from celery_redlock.core.nodes.redis.rounds import gather
from celery_redlock.core.nodes.redis.wire import Partial, pack, parse

# -- encoder -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("PING",),
        ("EVALSHA", "a" * 40, 2, "k1", "k2", b"\x00\r\nraw", 0, -17, 10**20),
        ("SET", "clé ✓", "", 1.5),
    ],
)
def test_pack_matches_redis_py(args):
    assert pack(args) == b"".join(redis.Connection().pack_command(*args))


def test_pack_encodes_str_as_utf8_and_int_as_decimal():
    assert pack(("GET", "é", 42)) == b"*3\r\n$3\r\nGET\r\n$2\r\n\xc3\xa9\r\n$2\r\n42\r\n"


@pytest.mark.parametrize("bad", [True, None, object()])
def test_pack_refuses_what_redis_py_refuses(bad):
    with pytest.raises(DataError):
        pack(("SET", "k", bad))


# -- parser --------------------------------------------------------------------------------

PAYLOADS = [
    b":42\r\n",
    b":-1\r\n",
    b"+OK\r\n",
    b"$5\r\nhello\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"$4\r\na\r\nb\r\n",  # a bulk string may hold CRLF
    b"*0\r\n",
    b"*-1\r\n",
    b"*3\r\n:1\r\n$-1\r\n*2\r\n$1\r\nx\r\n*1\r\n:2\r\n",
    b"*2\r\n$3\r\nfoo\r\n-ERR inside an array\r\n",
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    b"-ERR Error running script: boom\r\n",
]


def redis_py_reads(payload: bytes):
    """What redis-py's own RESP2 reader makes of ``payload`` (errors returned, not raised)."""
    ours, theirs = socket.socketpair()
    conn = redis.Connection(protocol=2)
    conn._sock = ours
    conn._parser.on_connect(conn)
    try:
        theirs.sendall(payload)
        return conn.read_response()
    except ResponseError as exc:
        return exc
    finally:
        conn.disconnect()
        theirs.close()


def same(a, b) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, BaseException):
        return type(a) is type(b) and a.args == b.args
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("payload", PAYLOADS)
def test_parse_returns_what_redis_py_returns(payload):
    reply, end = parse(payload, 0)
    assert end == len(payload)
    assert same(reply, redis_py_reads(payload))


def test_parse_values():
    nested = b"*3\r\n:1\r\n$-1\r\n*2\r\n$1\r\nx\r\n*1\r\n:2\r\n"
    assert parse(nested, 0)[0] == [1, None, [b"x", [2]]]
    assert parse(b"+OK\r\n", 0)[0] == b"OK"
    assert parse(b"*-1\r\n", 0)[0] is None


def test_parse_errors_are_values_of_redis_py_classes():
    noscript = parse(b"-NOSCRIPT No matching script.\r\n", 0)[0]
    assert type(noscript) is NoScriptError
    assert str(noscript) == "No matching script."
    generic = parse(b"-ERR unknown command 'NOPE'\r\n", 0)[0]
    assert type(generic) is ResponseError
    assert str(generic) == "unknown command 'NOPE'"  # redis-py drops the ERR code


def test_parse_raises_an_error_redis_py_counts_as_a_connection_failure():
    with pytest.raises(BusyLoadingError):
        parse(b"-LOADING Redis is loading the dataset in memory\r\n", 0)


def test_parse_refuses_an_unknown_type():
    with pytest.raises(InvalidResponse):
        parse(b"!3\r\nabc\r\n", 0)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_parse_of_every_prefix_asks_for_more(payload):
    for cut in range(len(payload)):
        with pytest.raises(Partial):
            parse(payload[:cut], 0)


# -- which nodes take the lean path ------------------------------------------------------------


def test_lean_only_for_plain_urls_with_default_replies():
    assert Node("redis://127.0.0.1:6379/0", 0.1).lean
    assert Node("unix:///tmp/redis.sock", 0.1).lean
    assert not Node("rediss://127.0.0.1:6379/0", 0.1).lean
    assert not Node("redis://127.0.0.1:6379/0?protocol=3", 0.1).lean
    assert not Node("redis://127.0.0.1:6379/0?decode_responses=1", 0.1).lean
    assert not Node(redis.Redis(), 0.1).lean
    assert not Node(fakeredis.FakeRedis(server=fakeredis.FakeServer()), 0.1).lean


def test_a_fakeredis_node_goes_through_redis_py():
    node = Node(fakeredis.FakeRedis(server=fakeredis.FakeServer()), 0.1)
    assert gather([node], ("SET", "k", "v"), 1) == [b"OK"]
    assert gather([node], ("GET", "k"), 1) == [b"v"]


REPLY = b"*2\r\n$5\r\nhello\r\n:7\r\n"
CUT = REPLY[:9]  # a peer that sends this closes the connection after it
#: The timeout of the calls whose replies are counted: no reply a loaded host delays
#: may time out and be read, owed, by the next call.
LOADED = 10.0


class ScriptedPeer:
    """A peer that answers the n-th command it gets (on any connection) with
    ``answers[n]``, then ``REPLY``; after ``CUT`` it closes the connection. No
    redis-server can be made to cut a reply short or send garbage on cue."""

    def __init__(self, answers: list[bytes]):
        self.answers = answers
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            while conn.recv(65536):  # one command per recv: they are tiny
                answer = self.answers.pop(0) if self.answers else REPLY
                conn.sendall(answer)
                if answer is CUT:
                    time.sleep(0.05)  # the half reply is read before the close
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def peer_factory():
    made: list[ScriptedPeer] = []

    def make(answers: list[bytes]) -> ScriptedPeer:
        made.append(ScriptedPeer(answers))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


def test_a_new_connection_closed_mid_reply_is_an_error(peer_factory):
    peer = peer_factory([CUT])
    node = Node(peer.url, LOADED)
    reply = gather([node], ("ANY",), LOADED)[0]
    assert isinstance(reply, redis.ConnectionError)
    assert not isinstance(reply, redis.TimeoutError)
    assert node._idle == []
    assert peer.connections == 1


def test_a_reused_connection_closed_mid_reply_is_sent_again_once(peer_factory):
    peer = peer_factory([REPLY, CUT])  # the reused connection is cut short, a new one answers
    node = Node(peer.url, LOADED)
    assert gather([node], ("ANY",), LOADED) == [[b"hello", 7]]
    assert gather([node], ("ANY",), LOADED) == [[b"hello", 7]]
    assert peer.connections == 2
    assert len(node._idle) == 1


def test_a_reused_connection_that_fails_twice_is_an_error(peer_factory):
    peer = peer_factory([REPLY, CUT, CUT])
    node = Node(peer.url, LOADED)
    gather([node], ("ANY",), LOADED)
    reply = gather([node], ("ANY",), LOADED)[0]
    assert isinstance(reply, redis.ConnectionError)
    assert peer.connections == 2
    assert node._idle == []


@pytest.mark.parametrize("garbage", [b"!3\r\nabc\r\n", b"$x\r\n", b":1.5\r\n"])
def test_a_reply_that_is_not_resp2_is_an_error_and_closes_the_connection(peer_factory, garbage):
    peer = peer_factory([garbage])
    node = Node(peer.url, 1.0)
    assert isinstance(gather([node], ("ANY",), 1)[0], InvalidResponse)
    assert node._idle == []
