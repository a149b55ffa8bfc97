"""AsyncRedlock's native PostgreSQL calls under faults: the sync client's errors,
types and ``heals`` alike, for a node killed, refusing, paused, refusing the
password or without the synchronous standby ``min_replicas`` needs; and a
connection made before a fork left to the parent."""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_redlock import AsyncRedlock, Redlock
from celery_redlock.exceptions import NodeError, QuorumUnavailable, heals

pytestmark = pytest.mark.integration


def errors_of(sync: Redlock, rl: AsyncRedlock, loop: asyncio.AbstractEventLoop) -> list[dict]:
    """Each client's QuorumUnavailable for one try: node -> (error type, heals,
    whether it says the node gave no reply)."""
    seen = []
    for attempt in (lambda: sync.try_acquire("down", ttl=5),
                    lambda: loop.run_until_complete(rl.try_acquire("down", ttl=5))):  # fmt: skip
        with pytest.raises(QuorumUnavailable) as caught:
            attempt()
        errors = caught.value.errors.items()
        seen.append({node: (type(e), heals(e), "no reply" in str(e)) for node, e in errors})
    return seen


def warmed(sync: Redlock, rl: AsyncRedlock, loop: asyncio.AbstractEventLoop) -> None:
    """A cycle passed on every node, by each client: a server fresh from its start
    plans the node's functions on first use, which a loaded host may make outlast
    a short node timeout: go again."""

    def sync_cycle() -> bool:
        lease = sync.acquire("warm", ttl=5)
        if lease is not None:
            sync.release(lease)
        return lease is not None

    async def async_cycle() -> bool:
        lease = await rl.acquire("warm", ttl=5)
        if lease is not None:
            await rl.release(lease)
        return lease is not None

    deadline = time.monotonic() + 60
    for cycle in (sync_cycle, lambda: loop.run_until_complete(async_cycle())):
        while True:
            try:
                if cycle():
                    break
            except QuorumUnavailable:
                pass
            assert time.monotonic() < deadline, "no cycle passed in 60 s"
            time.sleep(0.2)


def test_killed_refusing_and_paused_nodes_give_the_sync_clients_errors(postgres_nodes3):
    # 1 s: the answering node must, on a loaded host too; the paused ones never do
    sync = Redlock(postgres_nodes3.urls, node_timeout=1.0)
    rl = AsyncRedlock(redlock=sync)
    loop = asyncio.new_event_loop()
    try:
        warmed(sync, rl, loop)  # idle connections on every node, both clients
        postgres_nodes3[0].kill()  # a minority: the quorum carries on
        lease = loop.run_until_complete(rl.acquire("up", ttl=5))
        assert lease is not None
        loop.run_until_complete(rl.release(lease))
        postgres_nodes3[1].kill()  # their idle connections broken, then the port refuses
        for _ in range(2):  # the broken connections, then new ones refused
            by_sync, by_async = errors_of(sync, rl, loop)
            assert by_sync == by_async
            assert len(by_async) == 2 and all(
                issubclass(kind, NodeError) and cured for kind, cured, _ in by_async.values()
            ), by_async
        for server in postgres_nodes3[:2]:
            server.start()
        warmed(sync, rl, loop)  # connected again: no connect to time out
        postgres_nodes3.pause(0)
        postgres_nodes3.pause(1)
        by_sync, by_async = errors_of(sync, rl, loop)
        assert by_sync == by_async
        assert len(by_async) == 2 and all(
            cured and silent for _, cured, silent in by_async.values()
        ), by_async
        postgres_nodes3.resume(0)
        postgres_nodes3.resume(1)
        lease = loop.run_until_complete(rl.acquire("up", ttl=5, blocking=True, timeout=30))
        assert lease is not None  # connections left mid-call were dropped: new ones answer
        loop.run_until_complete(rl.release(lease))
    finally:
        loop.close()


@pytest.fixture
def password_url(postgres_node1) -> Iterator[str]:
    """A role ``crl_pw`` whose password the server checks (scram) on TCP: its
    node's URL with a wrong password."""
    server = postgres_node1[0]
    hba = Path(server.data, "pg_hba.conf")
    trusting = hba.read_text()
    hba.write_text("host all crl_pw 127.0.0.1/32 scram-sha-256\n" + trusting)  # first match wins
    server.sql("CREATE ROLE crl_pw LOGIN PASSWORD 'pw-right'")
    server.sql("SELECT pg_reload_conf()")
    yield f"postgresql://crl_pw:pw-wrong@{server.host}:{server.port}/postgres"
    hba.write_text(trusting)
    server.sql("SELECT pg_reload_conf()")
    server.sql("DROP ROLE crl_pw")


def test_a_wrong_password_cannot_heal_as_for_the_sync_client(password_url):
    sync = Redlock([password_url], node_timeout=1.0)
    rl = AsyncRedlock(redlock=sync)
    loop = asyncio.new_event_loop()
    try:
        by_sync, by_async = errors_of(sync, rl, loop)
        with pytest.raises(QuorumUnavailable) as caught:
            loop.run_until_complete(rl.try_acquire("down", ttl=5))
    finally:
        loop.close()
    assert by_sync == by_async
    ((kind, cured, _),) = by_async.values()
    assert issubclass(kind, NodeError) and not cured
    (error,) = caught.value.errors.values()
    assert "password authentication failed" in str(error) and "pw-wrong" not in str(error)
    assert not caught.value.heals


def test_min_replicas_without_a_synchronous_standby_cannot_heal_as_for_the_sync_client(
    postgres_node1,
):
    sync = Redlock(postgres_node1.urls, node_timeout=2, min_replicas=1)
    rl = AsyncRedlock(postgres_node1.urls, node_timeout=2, min_replicas=1)  # nodes of its own
    with pytest.raises(QuorumUnavailable, match="needs a synchronous standby") as caught:
        asyncio.run(rl.try_acquire("pay", ttl=5))
    assert not caught.value.heals
    with pytest.raises(QuorumUnavailable, match="needs a synchronous standby"):
        sync.try_acquire("pay", ttl=5)
    assert not postgres_node1[0].keys()


def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents(postgres_node1):
    from celery_redlock.core.nodes.postgres import aio as native

    rl = AsyncRedlock(postgres_node1.urls, node_timeout=2.0)
    (node,) = rl.sync.nodes
    loop = asyncio.new_event_loop()

    async def cycle() -> int:
        await rl.release(await rl.acquire("forked", ttl=5))
        (conn,) = native._pools[loop][id(node)].idle
        return conn.pgconn.backend_pid

    try:
        parents = loop.run_until_complete(cycle())
        with warnings.catch_warnings():  # Python 3.12+ frowns on fork with threads running
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: the same loop and node, a connection of its own
            try:
                ok = loop.run_until_complete(cycle()) != parents
            except BaseException:
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert loop.run_until_complete(cycle()) == parents, "the parent's session is whole"
    finally:
        loop.close()
