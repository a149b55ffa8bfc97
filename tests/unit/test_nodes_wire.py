"""The lean wire path of :func:`celery_redlock._nodes.gather`: RESP encoder, RESP2
parser, and rounds on real redis-server nodes (partial sends and reads, server
errors, timeouts, a peer that closes mid-reply)."""

from __future__ import annotations

import os
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

from celery_redlock._nodes import Node, _pack, _parse, _Partial, gather, run_script
from celery_redlock._scripts import Script

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
    assert _pack(args) == b"".join(redis.Connection().pack_command(*args))


def test_pack_encodes_str_as_utf8_and_int_as_decimal():
    assert _pack(("GET", "é", 42)) == b"*3\r\n$3\r\nGET\r\n$2\r\n\xc3\xa9\r\n$2\r\n42\r\n"


@pytest.mark.parametrize("bad", [True, None, object()])
def test_pack_refuses_what_redis_py_refuses(bad):
    with pytest.raises(DataError):
        _pack(("SET", "k", bad))


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
    reply, end = _parse(payload, 0)
    assert end == len(payload)
    assert same(reply, redis_py_reads(payload))


def test_parse_values():
    nested = b"*3\r\n:1\r\n$-1\r\n*2\r\n$1\r\nx\r\n*1\r\n:2\r\n"
    assert _parse(nested, 0)[0] == [1, None, [b"x", [2]]]
    assert _parse(b"+OK\r\n", 0)[0] == b"OK"
    assert _parse(b"*-1\r\n", 0)[0] is None


def test_parse_errors_are_values_of_redis_py_classes():
    noscript = _parse(b"-NOSCRIPT No matching script.\r\n", 0)[0]
    assert type(noscript) is NoScriptError
    assert str(noscript) == "No matching script."
    generic = _parse(b"-ERR unknown command 'NOPE'\r\n", 0)[0]
    assert type(generic) is ResponseError
    assert str(generic) == "unknown command 'NOPE'"  # redis-py drops the ERR code


def test_parse_raises_an_error_redis_py_counts_as_a_connection_failure():
    with pytest.raises(BusyLoadingError):
        _parse(b"-LOADING Redis is loading the dataset in memory\r\n", 0)


def test_parse_refuses_an_unknown_type():
    with pytest.raises(InvalidResponse):
        _parse(b"!3\r\nabc\r\n", 0)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_parse_of_every_prefix_asks_for_more(payload):
    for cut in range(len(payload)):
        with pytest.raises(_Partial):
            _parse(payload[:cut], 0)


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


# -- rounds on real nodes ------------------------------------------------------------------

SCRIPT = Script("nested", "return {1, false, {'x', {2}}, redis.call('GET', KEYS[1])}")


@pytest.mark.integration
def test_round_replies_and_connection_reuse(redis_nodes3):
    nodes = [Node(url, 1.0) for url in redis_nodes3.urls]
    assert gather(nodes, ("SET", "k", "v"), 1) == [b"OK"] * 3
    assert run_script(SCRIPT, nodes, ("k",), (), 1) == [[1, None, [b"x", [2]], b"v"]] * 3
    assert [len(node._idle) for node in nodes] == [1, 1, 1]


@pytest.mark.integration
def test_server_errors_are_values_and_keep_the_connection(redis_nodes3):
    nodes = [Node(url, 1.0) for url in redis_nodes3.urls]
    replies = gather(nodes, ("EVALSHA", "0" * 40, 0), 1)
    assert all(type(r) is NoScriptError for r in replies)
    gather(nodes[:1], ("SET", "s", "text"), 1)
    wrong = gather(nodes[:1], ("INCR", "s"), 1)[0]
    assert type(wrong) is ResponseError
    assert "not an integer" in str(wrong)
    assert [len(node._idle) for node in nodes] == [1, 1, 1]


@pytest.mark.integration
def test_replies_split_across_recv_calls_and_partial_sends(redis_nodes3):
    """8 MB each way: the command takes several sends, the reply several recvs."""
    nodes = [Node(url, 5.0) for url in redis_nodes3.urls]
    big = os.urandom(8 << 20)
    assert gather(nodes, ("SET", "big", big), 5) == [b"OK"] * 3
    assert gather(nodes, ("GET", "big"), 5) == [big] * 3
    assert gather(nodes, ("STRLEN", "big"), 5) == [len(big)] * 3


@pytest.mark.integration
def test_unix_socket_node(redis_node_factory, tmp_path):
    path = str(tmp_path / "redis.sock")
    redis_node_factory(1, extra_args=["--unixsocket", path, "--unixsocketperm", "700"])
    node = Node(f"unix://{path}?db=1", 1.0)
    assert node.lean
    assert gather([node], ("SET", "k", "v"), 1) == [b"OK"]
    assert gather([node], ("GET", "k"), 1) == [b"v"]


@pytest.mark.integration
def test_a_hung_node_costs_one_timeout_and_its_connection(redis_nodes3):
    nodes = [Node(url, 1.0) for url in redis_nodes3.urls]
    gather(nodes, ("PING",), 1)  # every node has an idle connection
    redis_nodes3.pause(1)
    started = time.monotonic()
    replies = gather(nodes, ("PING",), 0.3)
    elapsed = time.monotonic() - started
    assert replies[0] == replies[2] == b"PONG"
    assert isinstance(replies[1], redis.TimeoutError)
    assert 0.3 <= elapsed < 0.5
    assert [len(node._idle) for node in nodes] == [1, 0, 1]  # the timed-out one is closed


@pytest.mark.integration
def test_a_command_stuck_in_the_send_buffer_times_out(redis_nodes3):
    nodes = [Node(url, 1.0) for url in redis_nodes3.urls]
    redis_nodes3.pause(0)
    replies = gather(nodes, ("SET", "big", b"x" * (32 << 20)), 0.5)
    assert isinstance(replies[0], redis.TimeoutError)
    assert "writing" in str(replies[0])
    assert replies[1:] == [b"OK", b"OK"]


REPLY = b"*2\r\n$5\r\nhello\r\n:7\r\n"
CUT = REPLY[:9]  # a peer that sends this closes the connection after it


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
    node = Node(peer.url, 1.0)
    reply = gather([node], ("ANY",), 1)[0]
    assert isinstance(reply, redis.ConnectionError)
    assert not isinstance(reply, redis.TimeoutError)
    assert node._idle == []
    assert peer.connections == 1


def test_a_reused_connection_closed_mid_reply_is_sent_again_once(peer_factory):
    peer = peer_factory([REPLY, CUT])  # the reused connection is cut short, a new one answers
    node = Node(peer.url, 1.0)
    assert gather([node], ("ANY",), 1) == [[b"hello", 7]]
    assert gather([node], ("ANY",), 1) == [[b"hello", 7]]
    assert peer.connections == 2
    assert len(node._idle) == 1


def test_a_reused_connection_that_fails_twice_is_an_error(peer_factory):
    peer = peer_factory([REPLY, CUT, CUT])
    node = Node(peer.url, 1.0)
    gather([node], ("ANY",), 1)
    reply = gather([node], ("ANY",), 1)[0]
    assert isinstance(reply, redis.ConnectionError)
    assert peer.connections == 2
    assert node._idle == []


@pytest.mark.parametrize("garbage", [b"!3\r\nabc\r\n", b"$x\r\n", b":1.5\r\n"])
def test_a_reply_that_is_not_resp2_is_an_error_and_closes_the_connection(peer_factory, garbage):
    peer = peer_factory([garbage])
    node = Node(peer.url, 1.0)
    assert isinstance(gather([node], ("ANY",), 1)[0], InvalidResponse)
    assert node._idle == []
