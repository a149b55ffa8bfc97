"""The etcd node's HTTP/1.1 exchange against replies a member could send, from a
loopback server that writes them byte for byte (a real etcd's ordinary and
chunked replies are read in ``tests/core/integration/test_etcd_node.py``)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from celery_redlock.core.nodes.etcd.exchange import BadReply, Connection

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
#: In a server's replies: close the connection here (else it stays open until the end).
CLOSE = b"<close>"


class Server:
    """A loopback server that answers each request with the next of its replies."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.replies: list[bytes] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def start(self, *replies: bytes) -> Connection:
        """Serve ``replies``: a connection to this server, open."""
        self.replies = list(replies)
        self.thread.start()
        conn = Connection("127.0.0.1", self.listener.getsockname()[1])
        conn.connect(2.0)
        return conn

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            while self.replies and self.replies[0] != CLOSE and conn.recv(65536):
                conn.sendall(self.replies.pop(0))
            if not self.replies:
                self.done.wait(10)


@pytest.fixture
def server() -> Iterator[Server]:
    served = Server()
    yield served
    served.done.set()
    served.listener.close()


def test_replies_by_length_in_chunks_and_to_the_end(server):
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'3;ext=1\r\n{"a\r\n4\r\n":1}\r\n0\r\nTrailer: x\r\n\r\n'
    )
    to_the_end = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"b":2}'
    conn = server.start(OK, chunked, to_the_end, CLOSE)
    assert conn.post("/v3/kv/range", b"{}", None, 2.0) == (200, b"{}")
    assert conn.post("/v3/kv/range", b"{}", "tok", 2.0) == (200, b'{"a":1}')
    assert conn.sock is not None  # kept alive after a chunked reply
    assert conn.post("/v3/kv/range", b"{}", None, 2.0) == (200, b'{"b":2}')
    assert conn.sock is None  # a body to the connection's end closes it


def test_connection_close_closes_it_after_the_reply(server):
    conn = server.start(
        b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert conn.post("/v3/kv/txn", b"{}", None, 2.0) == (400, b"{}")
    assert conn.sock is None


@pytest.mark.parametrize(
    "reply, error",
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", BadReply),
        (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", BadReply),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", ConnectionResetError),
        (b"HTTP/1.1 200 OK\r\nContent-Le", ConnectionResetError),
        (b"", ConnectionResetError),
    ],
    ids=["not-http", "bad-length", "short-body", "short-headers", "closed"],
)
def test_a_reply_that_is_not_http_or_is_cut_short_fails_and_closes(server, reply, error):
    conn = server.start(reply, CLOSE)
    with pytest.raises(error):
        conn.post("/v3/kv/range", b"{}", None, 2.0)
    assert conn.sock is None


def test_no_reply_in_time_is_a_timeout(server):
    conn = server.start(b"HTTP/1.1 200 OK\r\n")  # and then nothing, the connection open
    with pytest.raises(TimeoutError):
        conn.post("/v3/kv/range", b"{}", None, 0.2)
    assert conn.sock is None
