"""The health rules in each kind's words: what ``celery redlock nodes``, the
dashboard and the worker's start line say of a node, from its NodeInfo."""

from __future__ import annotations

import pytest

from celery_redlock._format import nodes_text
from celery_redlock._health import checks, findings, node_row
from celery_redlock.core import EtcdInfo, NodeInfo, PostgresInfo, RedisInfo

PG = "postgresql://app@db:5432/shop"
ETCD = "etcd://e1:2379,e2:2379,e3:2379"
REDIS = "redis://r1:6379/0"

REDIS_WORDS = ("Redis", "maxmemory", "aof", "AOF", "eviction", "masters", "replica")


def pg(**settings: str) -> NodeInfo:
    specific = PostgresInfo(
        **{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", **settings}
    )
    return NodeInfo(
        PG, None, 0.001, "postgresql 15.4", "primary", 0, kind="postgres", specific=specific
    )


def etcd(members: int = 3, leader: str | None = "m1") -> NodeInfo:
    return NodeInfo(
        ETCD, None, 0.001, "etcd 3.5.9", "cluster", kind="etcd", specific=EtcdInfo(members, leader)
    )


def redis(policy: str = "noeviction", aof: bool | None = True) -> NodeInfo:
    specific = RedisInfo(policy, 0, aof, "always" if aof else None)
    return NodeInfo(REDIS, None, 0.001, "7.2.4", "master", 0, specific=specific)


def said(info: NodeInfo) -> str:
    return " ".join(node_row(info)) + "\n" + "\n".join(findings([info], 0.5))


def test_a_sound_postgres_node_is_described_without_a_redis_word():
    text = said(pg())
    assert "fsync on, synchronous_commit on, full_page_writes on" in text
    assert "WARNING" not in text and "UNSAFE" not in text
    assert not [w for w in REDIS_WORDS if w in text], text


@pytest.mark.parametrize("setting", ["fsync", "synchronous_commit", "full_page_writes"])
def test_each_postgres_setting_a_crash_promise_rests_on_is_flagged(setting):
    text = said(pg(**{setting: "off"}))
    assert f"{setting} off (UNSAFE)" in text
    assert f"WARNING {PG}: {setting} off: " in text
    assert text.count("UNSAFE") == 1 and text.count("WARNING") == 1


def test_a_postgres_standby_and_its_standbys_in_postgres_words():
    text = "\n".join(findings([pg()._replace(role="standby")], 0.5))
    assert "a standby: it refuses writes" in text and "independent masters" not in text
    primary = pg()._replace(replicas=2)
    assert "2 standbys and redlock_min_replicas 0" in "\n".join(findings([primary], 0.5))
    assert "1 standby connected, redlock_min_replicas is 2" in "\n".join(
        findings([pg()._replace(replicas=1)], 0.5, min_replicas=2)
    )


def test_an_etcd_cluster_shows_its_members_quorum_and_leader():
    assert [str(c) for c in checks(etcd())] == ["members 3 (quorum 2)", "leader m1"]
    assert "WARNING" not in said(etcd())
    assert not [w for w in REDIS_WORDS if w in said(etcd())]


def test_a_one_member_etcd_cluster_is_flagged_as_a_single_node():
    text = said(etcd(members=1))
    assert "members 1 (quorum 1) (UNSAFE)" in text
    assert f"WARNING {ETCD}: 1 member: the cluster is one server" in text


def test_an_etcd_cluster_without_a_leader_or_with_an_even_count():
    assert "leader none (UNSAFE)" in said(etcd(leader=None))
    assert "WARNING" in said(etcd(leader=None))
    assert "note    " + ETCD + ": 4 members need 3" in said(etcd(members=4))


def test_redis_keeps_its_own_checks():
    assert "maxmemory-policy volatile-lru (UNSAFE)" in said(redis("volatile-lru"))
    assert "no AOF" in said(redis(aof=False))
    assert "aof on, appendfsync always" in said(redis())


def test_a_node_that_is_down_shows_no_check():
    down = NodeInfo(PG, "connection refused", kind="postgres")
    assert checks(down) == [] and node_row(down)[1:] == ["DOWN", "-", "-", "-"]


def test_one_server_named_twice_in_its_kinds_words():
    a, b = (
        pg()._replace(server_id="7 started t"),
        pg()._replace(node=PG + "2", server_id="7 started t"),
    )
    assert f"same server as {PG} (system identifier 7 started t)" in "\n".join(
        findings([a, b], 0.5)
    )


@pytest.mark.parametrize(
    "url, words, not_words",
    [
        (PG, ["ONE node, a PostgreSQL database", "asynchronous standby"], ["Redis", "masters"]),
        ("postgres://db/shop", ["PostgreSQL database"], ["Redis"]),
        (ETCD, ["ONE node, an etcd cluster", "members' quorum"], ["Redis", "masters"]),
        (REDIS, ["this one Redis server", "3 or 5 independent masters"], []),
        ("redis+cluster://r1:7000", ["this one Redis Cluster"], []),
    ],
)
def test_a_lone_node_is_described_in_its_kinds_words(url, words, not_words):
    text = nodes_text([url], 1, from_broker=False)
    assert all(w in text for w in words) and not any(w in text for w in not_words), text
