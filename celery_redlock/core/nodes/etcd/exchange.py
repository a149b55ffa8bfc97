"""HTTP/1.1 on one kept-alive connection to an etcd member: a POST of JSON, its reply.

Not ``http.client``, which parses every reply's headers as an e-mail message: half of
an etcd lock call's instructions went there (``benchmarks/instructions.py``). A body
comes by ``Content-Length`` or in chunks (a large range)."""

from __future__ import annotations

import socket
import ssl
from typing import Any

__all__ = ["BadReply", "Connection"]

_LINE = 65536  # the longest status or header line read
_ENDS = (b"\r\n", b"\n", b"")


class BadReply(OSError):
    """A reply that is not HTTP/1.1 (the connection is closed)."""


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
        """(status, reply body) of a POST of ``body``, ``timeout`` seconds per socket
        operation. Raises OSError (``TimeoutError``, :class:`BadReply`, a reset),
        the connection closed."""
        assert self.sock is not None, "connect() first"
        auth = f"Authorization: {token}\r\n" if token else ""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(head.encode() + body)
            return self._reply()
        except ValueError as exc:  # a length that is no number
            self.close()
            raise BadReply(f"not an HTTP reply: {exc}") from None
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
        while (line := read(_LINE)) not in _ENDS:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
        if not line:
            raise ConnectionResetError("the reply's headers were cut short")
        if chunked:
            body = b"".join(iter(self._chunk, b""))
            while read(_LINE) not in _ENDS:
                pass  # trailers, then the blank line
        elif length >= 0 or rest[:3] in (b"204", b"304"):  # the latter with no body
            body = self._exactly(max(length, 0))
        else:  # the body runs to the connection's end
            body, close = self.reader.read(), True
        if close:
            self.close()
        return int(rest[:3]), body

    def _chunk(self) -> bytes:
        size = int(self.reader.readline(_LINE).split(b";")[0], 16)
        data = self._exactly(size)
        if size:
            self._exactly(2)  # the chunk's CRLF
        return data

    def _exactly(self, size: int) -> bytes:
        data = self.reader.read(size)
        if len(data) < size:
            raise ConnectionResetError("the reply was cut short")
        return bytes(data)
