"""The core's public reads for the tools: typed results or a NodeError per node,
whatever the kind, and each kind's words (memory nodes and fakeredis ones)."""

from __future__ import annotations

import fakeredis

from celery_redlock.core import (
    EtcdInfo,
    Get,
    KindWords,
    NodeError,
    PostgresInfo,
    ReadHash,
    ReadTtl,
    ReadType,
    RedisInfo,
    Redlock,
    ZookeeperInfo,
    ping,
    read,
    specific_type,
)
from celery_redlock.testing.memory import MemoryNodes


def test_a_read_gives_typed_results_and_a_down_node_a_node_error():
    with MemoryNodes(3) as nodes:
        client = Redlock(nodes.urls, node_timeout=0.5)
        try:
            nodes[0].client().set("k", "v", px=60000)
            nodes[2].kill()
            types = read(client, ReadType("k"))
            assert [t.name for t in types[:2]] == ["string", "none"]
            assert isinstance(types[2], NodeError) and types[2].heals
            first = read(client, ReadTtl("k"), client.nodes[:1])
            assert len(first) == 1 and 0 < first[0].pttl_ms <= 60000
            assert read(client, Get("k"), client.nodes[:1])[0].value == "v"
            assert isinstance(read(client, ReadHash("k"), client.nodes[:1])[0], NodeError)
            assert [isinstance(r, NodeError) for r in ping(client)] == [False, False, True]
        finally:
            client.close()


def test_a_redis_error_is_a_node_error_of_its_text():
    server = fakeredis.FakeServer()
    client = Redlock([fakeredis.FakeRedis(server=server)], node_timeout=0.5)
    server.connected = False
    (error,) = ping(client)
    assert isinstance(error, NodeError) and error.heals
    assert "redis" not in type(error).__module__ and error.__cause__ is not None
    assert str(error) == str(error.__cause__) or str(error) == type(error.__cause__).__name__


def test_each_kind_has_its_words_for_the_tools():
    assert specific_type("redis://h:6379/0") is RedisInfo
    assert specific_type("postgresql://u@h/db") is PostgresInfo
    assert specific_type("etcd://h:2379") is EtcdInfo
    assert specific_type("zookeeper://h:2181") is ZookeeperInfo
    assert specific_type("memory://m") is RedisInfo  # no record of its own: Redis's words
    assert PostgresInfo.words().copy == "standby" and RedisInfo.words().copy == "replica"
    assert "Redis Cluster" in RedisInfo.words("redis+cluster://h:7000").alone
    assert EtcdInfo.words().identity == "cluster id" and ZookeeperInfo.words() == KindWords(
        alone=ZookeeperInfo.words().alone
    )
