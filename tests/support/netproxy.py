"""Network faults between one client and one lock node: a TCP proxy on loopback.

A :class:`NodeProxy` listens on a port of its own on 127.0.0.1 and forwards
every connection to one lock node (a Redis master, a PostgreSQL server, an etcd
cluster's one member: the proxy forwards bytes, whatever the protocol); a
client that is to suffer network faults is given the proxies' URLs instead of
the nodes' (a prefork worker gets them in ``CRL_NODES``: the proxy lives in the
test process, independent of the worker, and the worker's processes connect to
its port). One proxy per (client, node) pair, so a fault can cut one worker
off while another still reaches the node: :class:`ProxyGrid` builds them.

Modes, switched at run time with :meth:`NodeProxy.set` (they apply at once to
new and open connections):

``pass``
    forward both ways.
``latency``
    forward both ways, each chunk delayed by ``delay`` seconds.
``slow_start``
    forward both ways, but a connection's first reply waits ``delay``
    seconds: a slow connect and handshake (``SELECT`` for a db other than 0),
    as on a loaded host; later replies flow at once.
``blackhole``
    connections are accepted, but nothing flows either way: what is in flight
    waits in the proxy and flows, late, once the mode ends (as a TCP
    partition that heals delivers late). A new connection's handshake
    (``SELECT`` for a db other than 0) hangs.
``blackhole_connect``
    as ``blackhole`` for open connections, and the TCP connect itself does not
    complete: the listening socket's accept queue (backlog 0) is kept full, so
    Linux drops further SYNs and ``connect`` hangs.
``reset``
    every open connection gets an RST (``SO_LINGER`` 0, then close), and so
    does every new one as soon as it is accepted.
``reply_loss``
    requests reach the node (and run there); replies are dropped.
``reply_cut``
    requests reach the node; each reply arrives without its last ``CUT``
    bytes (a PostgreSQL reply's closing ReadyForQuery message): a
    connection lost part-way through a reply.

Tests only.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit, urlunsplit

PASS = "pass"
LATENCY = "latency"
SLOW_START = "slow_start"
BLACKHOLE = "blackhole"
BLACKHOLE_CONNECT = "blackhole_connect"
RESET = "reset"
REPLY_LOSS = "reply_loss"
REPLY_CUT = "reply_cut"
MODES = (PASS, LATENCY, SLOW_START, BLACKHOLE, BLACKHOLE_CONNECT, RESET, REPLY_LOSS, REPLY_CUT)
#: The bytes a reply loses in ``reply_cut``.
CUT = 6

#: The modes in which nothing flows (data waits in the proxy).
_HOLDING = (BLACKHOLE, BLACKHOLE_CONNECT)
_BACKLOG = 128
_CHUNK = 65536


def _rst(sock: socket.socket) -> None:
    """Close ``sock`` with an RST instead of a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class _Link:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, proxy: NodeProxy, client: socket.socket, upstream: socket.socket):
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.closed = False
        self.replied = False
        for src, dst, is_reply in ((client, upstream, False), (upstream, client, True)):
            threading.Thread(
                target=self._pump, args=(src, dst, is_reply), daemon=True, name="netproxy-pump"
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, is_reply: bool) -> None:
        proxy = self.proxy
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                mode, delay = proxy._wait_while_holding(self)
                if self.closed:
                    break
                if mode == REPLY_LOSS and is_reply:
                    continue
                if mode == REPLY_CUT and is_reply:
                    data = data[:-CUT]
                if mode == LATENCY and delay > 0:
                    time.sleep(delay)
                if mode == SLOW_START and is_reply and not self.replied:
                    time.sleep(delay)
                self.replied = self.replied or is_reply
                dst.sendall(data)
        except OSError:
            pass
        self.close()

    def close(self, reset: bool = False) -> None:
        if self.closed and not reset:
            return
        self.closed = True
        with self.proxy._changed:
            self.proxy._changed.notify_all()  # a pump held in a blackhole lets go
        for sock in (self.client, self.upstream):
            if reset:
                _rst(sock)
            else:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        self.proxy._links.discard(self)


class NodeProxy:
    """A TCP proxy from a port of its own on 127.0.0.1 to one lock node.

    Args:
        host, port: the node.
        name: for messages (e.g. ``"a->n0"``).
    """

    def __init__(self, host: str, port: int, name: str = ""):
        self.target = (host, port)
        self.name = name or f"proxy->{host}:{port}"
        self.mode = PASS
        self.delay = 0.0
        self._changed = threading.Condition()
        self._links: set[_Link] = set()
        self._fillers: list[socket.socket] = []
        self._closed = False
        #: Connections accepted so far.
        self.accepted = 0
        self._paused = threading.Event()  # the accept loop stands still (blackhole_connect)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(_BACKLOG)
        self.port = self.listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True, name="netproxy")
        self._acceptor.start()

    # -- switching modes ----------------------------------------------------------------

    def set(self, mode: str, delay: float = 0.0) -> None:
        """Switch to ``mode`` (``delay``: seconds per chunk in ``latency``)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
        with self._changed:
            before, self.mode, self.delay = self.mode, mode, delay
            self._changed.notify_all()
        if before == BLACKHOLE_CONNECT and mode != BLACKHOLE_CONNECT:
            self._unfill()
        if mode == BLACKHOLE_CONNECT and before != BLACKHOLE_CONNECT:
            self._fill()
        if mode == RESET:
            for link in list(self._links):
                link.close(reset=True)

    def heal(self) -> None:
        self.set(PASS)

    def _fill(self) -> None:
        """Keep the accept queue full, so that new SYNs are dropped."""
        self._paused.clear()
        self._paused.wait(5)  # the accept loop has seen the mode and accepts no more
        self.listener.listen(0)  # accept queue of one: full with one connection in it
        for _ in range(4):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            try:
                filler.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            self._fillers.append(filler)
            # A filler that connects occupies the queue; one that does not shows it is full.
            _, writable, _ = select.select([], [filler], [], 0.2)
            if not writable:
                return

    def _unfill(self) -> None:
        if not self._closed:
            self.listener.listen(_BACKLOG)
        fillers, self._fillers = self._fillers, []
        for filler in fillers:
            filler.close()

    # -- forwarding ---------------------------------------------------------------------

    def _wait_while_holding(self, link: _Link) -> tuple[str, float]:
        with self._changed:
            while self.mode in _HOLDING and not link.closed and not self._closed:
                self._changed.wait(0.5)
            return self.mode, self.delay

    def _accept_loop(self) -> None:
        while not self._closed:
            if self.mode == BLACKHOLE_CONNECT:
                self._paused.set()
                time.sleep(0.01)
                continue
            try:
                readable, _, _ = select.select([self.listener], [], [], 0.02)
            except (OSError, ValueError):
                return
            if not readable or self.mode == BLACKHOLE_CONNECT:
                continue
            try:
                client, _ = self.listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            self.accepted += 1
            if self.mode == RESET:
                _rst(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:  # the node is down: so is the connection
                _rst(client)
                continue
            upstream.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._links.add(_Link(self, client, upstream))

    def url(self, template: str) -> str:
        """``template`` (a node's URL) with this proxy's host and port."""
        parts = urlsplit(template)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{self.port}"))

    def close(self) -> None:
        self._closed = True
        with self._changed:
            self._changed.notify_all()
        self.listener.close()
        self._unfill()
        for link in list(self._links):
            link.close()
        self._acceptor.join(2)

    def __repr__(self) -> str:
        return f"<NodeProxy {self.name} :{self.port} {self.mode}>"


def _endpoint(url: str) -> tuple[str, int]:
    """The one (host, port) a node URL names: one proxy stands for one endpoint, so a
    URL of several (an etcd cluster's members) is refused, not cut to its first."""
    parts = urlsplit(url)
    if "," in parts.netloc:
        raise ValueError(f"{url}: several endpoints; a proxy stands for one (one member)")
    return parts.hostname or "127.0.0.1", parts.port or 6379


class ProxyGrid:
    """One :class:`NodeProxy` per (client, node): ``grid[client][i]`` stands between
    ``client`` and node ``i``; ``grid.urls(client)`` are the URLs ``client`` is given.

    Args:
        node_urls: the nodes' URLs, one endpoint each (``redis://``,
            ``postgresql://``, ``etcd://``; user, path and query are kept).
        clients: the clients' names.
    """

    def __init__(self, node_urls: Sequence[str], clients: Iterable[str]):
        self.node_urls = list(node_urls)
        self.proxies: dict[str, list[NodeProxy]] = {}
        try:
            for client in clients:
                row = []
                for i, url in enumerate(self.node_urls):
                    host, port = _endpoint(url)
                    row.append(NodeProxy(host, port, f"{client}->n{i}"))
                    self.proxies[client] = row
        except BaseException:
            self.close()
            raise

    def __getitem__(self, client: str) -> list[NodeProxy]:
        return self.proxies[client]

    def urls(self, client: str, db: int | None = None) -> list[str]:
        """The node URLs ``client`` connects through (``db``: another database)."""
        out = []
        for proxy, url in zip(self.proxies[client], self.node_urls):
            if db is not None:
                url = urlunsplit(urlsplit(url)._replace(path=f"/{db}"))
            out.append(proxy.url(url))
        return out

    def set(self, client: str, nodes: Iterable[int], mode: str, delay: float = 0.0) -> None:
        for i in nodes:
            self.proxies[client][i].set(mode, delay)

    def heal(self) -> None:
        """Every proxy back to ``pass``."""
        for row in self.proxies.values():
            for proxy in row:
                proxy.heal()

    def close(self) -> None:
        for row in self.proxies.values():
            for proxy in row:
                proxy.close()

    def __enter__(self) -> ProxyGrid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
