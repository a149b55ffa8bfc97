"""The lean wire path of :func:`celery_redlock.core.nodes.redis.rounds.gather` on real redis-server
nodes: connection reuse, server errors as values, partial sends and reads, a unix
socket, hung nodes."""

from __future__ import annotations

import os
import time

import pytest
import redis
from redis.exceptions import NoScriptError, ResponseError

from celery_redlock.core.nodes.redis.node import Node
from celery_redlock.core.nodes.redis.rounds import gather, run_script
from celery_redlock.core.nodes.scripts import Script

pytestmark = pytest.mark.integration

# -- rounds on real nodes ------------------------------------------------------------------

SCRIPT = Script("nested", "return {1, false, {'x', {2}}, redis.call('GET', KEYS[1])}")


def test_round_replies_and_connection_reuse(redis_nodes3):
    nodes = [Node(url, 1.0) for url in redis_nodes3.urls]
    assert gather(nodes, ("SET", "k", "v"), 1) == [b"OK"] * 3
    assert run_script((SCRIPT, ("k",), ()), nodes, 1) == [[1, None, [b"x", [2]], b"v"]] * 3
    assert [len(node._idle) for node in nodes] == [1, 1, 1]


def test_server_errors_are_values_and_keep_the_connection(redis_nodes3):
    nodes = [Node(url, 1.0) for url in redis_nodes3.urls]
    replies = gather(nodes, ("EVALSHA", "0" * 40, 0), 1)
    assert all(type(r) is NoScriptError for r in replies)
    gather(nodes[:1], ("SET", "s", "text"), 1)
    wrong = gather(nodes[:1], ("INCR", "s"), 1)[0]
    assert type(wrong) is ResponseError
    assert "not an integer" in str(wrong)
    assert [len(node._idle) for node in nodes] == [1, 1, 1]


def test_replies_split_across_recv_calls_and_partial_sends(redis_nodes3):
    """8 MB each way: the command takes several sends, the reply several recvs."""
    nodes = [Node(url, 5.0) for url in redis_nodes3.urls]
    big = os.urandom(8 << 20)
    assert gather(nodes, ("SET", "big", big), 5) == [b"OK"] * 3
    assert gather(nodes, ("GET", "big"), 5) == [big] * 3
    assert gather(nodes, ("STRLEN", "big"), 5) == [len(big)] * 3


def test_unix_socket_node(redis_node_factory, tmp_path):
    path = str(tmp_path / "redis.sock")
    redis_node_factory(1, extra_args=["--unixsocket", path, "--unixsocketperm", "700"])
    node = Node(f"unix://{path}?db=1", 1.0)
    assert node.lean
    assert gather([node], ("SET", "k", "v"), 1) == [b"OK"]
    assert gather([node], ("GET", "k"), 1) == [b"v"]


def test_a_hung_node_costs_one_timeout_and_its_connection(redis_nodes3):
    nodes = [Node(url, 10.0) for url in redis_nodes3.urls]
    gather(nodes, ("PING",), 1)  # every node has an idle connection
    redis_nodes3.pause(1)
    started = time.monotonic()
    replies = gather(nodes, ("PING",), 0.5)
    elapsed = time.monotonic() - started
    assert replies[0] == replies[2] == b"PONG"
    assert isinstance(replies[1], redis.TimeoutError)
    assert 0.5 <= elapsed < 3 * 0.5  # one round timeout (3x slack), not the node's 10 s
    assert [len(node._idle) for node in nodes] == [1, 0, 1]  # the timed-out one is closed


def test_a_command_stuck_in_the_send_buffer_times_out(redis_nodes3):
    nodes = [Node(url, 1.0) for url in redis_nodes3.urls]
    redis_nodes3.pause(0)
    # 32 MB to each of 3 nodes: a round of 2 s leaves the live ones time to take it on
    # a loaded machine; the paused one never drains its socket, whatever the timeout
    replies = gather(nodes, ("SET", "big", b"x" * (32 << 20)), 2.0)
    assert isinstance(replies[0], redis.TimeoutError)
    assert "writing" in str(replies[0])
    assert replies[1:] == [b"OK", b"OK"]
