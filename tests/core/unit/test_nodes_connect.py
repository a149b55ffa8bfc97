"""How :func:`celery_redlock.core.nodes.redis.rounds.gather` opens new connections: all at once, in
the background, each within its own timeout; a node whose connects time out is
skipped for a while (its circuit breaker); a connection that connected is kept.

In-process peers only (a ``Peer`` answers every command; a
:class:`~tests.support.netproxy.NodeProxy` in front of one hangs the connect
or the handshake); the same on real nodes from a new process is in
``tests/faults/test_network_faults.py``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings

import pytest
import redis

from celery_redlock.core import connect
from celery_redlock.core.nodes.guard import BREAKER_MAX
from celery_redlock.core.nodes.redis.node import Node
from celery_redlock.core.nodes.redis.rounds import gather
from tests.core.unit.test_nodes_wire import REPLY, ScriptedPeer
from tests.support import netproxy

#: Wide enough for a loaded host: "at once" is bounded by half of it.
TIMEOUT = 0.5
PONG = [b"hello", 7]  # what a ScriptedPeer answers


class Peer(ScriptedPeer):
    """Answers SELECT with OK and every other command with ``REPLY``."""

    def __init__(self):
        super().__init__([])
        self.port = self.listener.getsockname()[1]

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):  # one command per recv: they are tiny
                    conn.sendall(b"+OK\r\n" if b"SELECT" in data else REPLY)
            except OSError:
                pass


@pytest.fixture
def peers():
    """``make(n, hang, hung)``: URLs (db 1: redis-py sends SELECT) of ``n`` peers,
    each behind a proxy; the proxies of ``hung`` hang with ``hang``."""
    made: list = []
    proxies: list[netproxy.NodeProxy] = []

    def make(n: int, hang: str = netproxy.PASS, hung: tuple[int, ...] = ()) -> list[str]:
        urls = []
        for i in range(n):
            peer = Peer()
            proxy = netproxy.NodeProxy("127.0.0.1", peer.port)
            made.extend([peer, proxy])
            proxies.append(proxy)
            if i in hung:
                proxy.set(hang)
            urls.append(f"redis://127.0.0.1:{proxy.port}/1")
        return urls

    make.proxies = proxies  # type: ignore[attr-defined]
    yield make
    for thing in made:
        thing.close()


def timed(nodes, timeout=TIMEOUT):
    started = time.monotonic()
    replies = gather(nodes, ("ANY",), timeout)
    return replies, time.monotonic() - started


@pytest.mark.parametrize("hang", [netproxy.BLACKHOLE_CONNECT, netproxy.BLACKHOLE])
def test_a_hung_first_node_leaves_the_others_their_whole_timeout(peers, hang):
    nodes = [Node(url, 1.0) for url in peers(5, hang, hung=(0,))]
    replies, took = timed(nodes)
    assert isinstance(replies[0], redis.TimeoutError), replies[0]
    # Before: the first node used up the round; the others got a millisecond each.
    assert replies[1:] == [PONG] * 4
    assert took < TIMEOUT + 0.3
    assert [len(node._idle) for node in nodes] == [0, 1, 1, 1, 1]


def test_connections_that_connected_are_kept_when_the_round_fails(peers):
    nodes = [Node(url, 1.0) for url in peers(3, netproxy.BLACKHOLE_CONNECT, hung=(0, 1))]
    replies, _ = timed(nodes)
    assert isinstance(replies[0], redis.TimeoutError) and isinstance(replies[1], redis.TimeoutError)
    assert replies[2] == PONG
    assert len(nodes[2]._idle) == 1  # the next round starts from it


def test_a_node_whose_connects_time_out_is_skipped_but_probed(peers):
    urls = peers(3, netproxy.BLACKHOLE_CONNECT, hung=(0,))
    nodes = [Node(url, 1.0) for url in urls]
    timed(nodes)
    assert nodes[0].breaker.backoff == TIMEOUT
    replies, took = timed(nodes)
    assert took < TIMEOUT / 2  # skipped at once, not waited for
    assert isinstance(replies[0], redis.ConnectionError)
    assert "its connects timed out" in str(replies[0])
    assert replies[1:] == [PONG, PONG]
    # Once the while is over, one probe goes out in the background, and the
    # round does not wait for it; the probe times out too: the while grows.
    time.sleep(TIMEOUT + 0.05)
    _, took = timed(nodes)
    assert took < TIMEOUT / 2
    assert nodes[0].breaker.probing
    deadline = time.monotonic() + 2
    while nodes[0].breaker.probing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not nodes[0].breaker.probing
    assert nodes[0].breaker.backoff == min(2 * TIMEOUT, BREAKER_MAX)


def test_a_probe_that_connects_closes_the_breaker_and_its_connection_is_used(peers):
    urls = peers(1, netproxy.BLACKHOLE_CONNECT, hung=(0,))
    (node,) = [Node(url, 1.0) for url in urls]
    timed([node])
    assert node.breaker.backoff
    peers.proxies[0].heal()
    time.sleep(TIMEOUT + 0.05)
    timed([node])  # due: the probe goes out
    deadline = time.monotonic() + 2
    while not node._idle and time.monotonic() < deadline:
        time.sleep(0.01)
    assert node.breaker.backoff == 0 and len(node._idle) == 1
    replies, _ = timed([node])
    assert replies == [PONG]


def test_no_thread_per_round(peers):
    nodes = [Node(url, 1.0) for url in peers(3)]
    timed(nodes)
    before = threading.active_count()
    for _ in range(50):
        for node in nodes:
            node.close()  # every round opens three connections
        replies, _ = timed(nodes, 1.0)
        assert replies == [PONG] * 3
    assert threading.active_count() <= before + 3


def test_a_forked_child_opens_its_own_connections(peers):
    nodes = [Node(url, 1.0) for url in peers(3, netproxy.BLACKHOLE_CONNECT, hung=(0,))]
    timed(nodes)
    assert nodes[0].breaker.backoff and connect.connector.value is not None
    with warnings.catch_warnings():  # Python 3.12+ frowns on fork with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: no connector thread, no idle connection, no breaker of the parent's
        ok = connect.connector.value is None
        replies = gather(nodes, ("ANY",), 1.0)
        ok = ok and replies[1:] == [PONG, PONG] and isinstance(replies[0], redis.TimeoutError)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
