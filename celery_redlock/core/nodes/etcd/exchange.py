"""HTTP/1.1 on one kept-alive connection to an etcd member: a POST of JSON, its reply.

Written here rather than taken from ``http.client``, which parses every reply's
headers as an e-mail message (``email.feedparser``): half of the instructions
of an etcd lock call went there (``benchmarks/instructions.py``). A reply is
read as etcd's gateway writes it: a status line, headers, and a body of
``Content-Length`` bytes or in chunks (a large range reply).
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

__all__ = ["BadReply", "Connection"]

#: The longest status or header line read (an etcd reply's are short).
_LINE = 65536
_ENDS = (b"\r\n", b"\n")


class BadReply(OSError):
    """A reply that is not HTTP/1.1: the connection is closed and the call fails."""


class Connection:
    """One socket to ``host:port`` (TLS with ``context``), opened by :meth:`connect`."""

    __slots__ = ("host", "port", "context", "sock", "reader")

    def __init__(self, host: str, port: int, context: ssl.SSLContext | None = None):
        self.host, self.port, self.context = host, port, context
        self.sock: socket.socket | None = None
        self.reader: Any = None  # the socket's buffered reader

    def connect(self, timeout: float) -> None:
        sock = socket.create_connection((self.host, self.port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock, self.reader = sock, sock.makefile("rb")

    def close(self) -> None:
        if self.sock is not None:
            self.reader.close()
            self.sock.close()
            self.sock = self.reader = None

    def post(self, path: str, body: bytes, token: str | None, timeout: float) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``path``: (status, reply body), within ``timeout``
        per socket operation.

        Raises:
            OSError: the connection failed, timed out (``TimeoutError``) or
                answered what is not HTTP (:class:`BadReply`); it is closed.
        """
        sock = self.sock
        assert sock is not None, "connect() first"
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        )
        if token:
            head += f"Authorization: {token}\r\n"
        try:
            sock.settimeout(timeout)
            sock.sendall(head.encode() + b"\r\n" + body)
            return self._reply()
        except BaseException:
            self.close()
            raise

    def _reply(self) -> tuple[int, bytes]:
        read = self.reader.readline
        line = read(_LINE)
        if not line:  # the member closed the connection (idle, or a restart)
            raise ConnectionResetError("the member closed the connection")
        version, _, rest = line.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not rest[:3].isdigit():
            raise BadReply(f"not an HTTP reply: {line[:60]!r}")
        length, chunked, close = -1, False, False
        while True:
            line = read(_LINE)
            if line in _ENDS:
                break
            if not line:
                raise ConnectionResetError("the reply's headers were cut short")
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = _number(value, 10)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
        if chunked:
            body = self._chunks()
        elif length >= 0:
            body = self._exactly(length)
        else:  # neither: the body runs to the connection's end
            body, close = self.reader.read(), True
        if close:
            self.close()
        return int(rest[:3]), body

    def _exactly(self, size: int) -> bytes:
        data = self.reader.read(size)
        if len(data) < size:
            raise ConnectionResetError("the reply was cut short")
        return bytes(data)

    def _chunks(self) -> bytes:
        read, parts = self.reader.readline, list[bytes]()
        while True:
            size = _number(read(_LINE).split(b";")[0], 16)
            if size == 0:
                while read(_LINE) not in (*_ENDS, b""):
                    pass  # trailers, then the blank line
                return b"".join(parts)
            parts.append(self._exactly(size))
            self._exactly(2)  # the chunk's CRLF


def _number(text: bytes, base: int) -> int:
    try:
        return int(text.strip(), base)
    except ValueError:
        raise BadReply(f"not a length: {text[:40]!r}") from None
