"""What a ZooKeeper lock node does of its own: bad input refused with the node
named and its password masked, kazoo missing named by its extra, expiry that
no client clock decides, digest authentication and its ACL, a mixed quorum,
and the nodes' rows in ZooKeeper's words."""

from __future__ import annotations

import sys
import time

import pytest

from celery_redlock._health import checks, findings
from celery_redlock.core import Lease, NodeInfo, Redlock, ZookeeperInfo
from celery_redlock.core.nodes import node_for
from celery_redlock.core.nodes.zookeeper.store import znode_name
from celery_redlock.exceptions import ConfigurationError, QuorumUnavailable
from celery_redlock.testing.nodes import free_port

pytestmark = pytest.mark.integration

NAME = "pay"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("zookeeper://", "no host:port"),
        ("zookeeper://zk-0:2181,zk-1", "'zk-1' must be host:port"),
        ("zookeeper://zk-0:2181?chroot=/x", r"unknown option\(s\) chroot"),
        ("zookeeper://zk-0:2181//double", "must be znode paths"),
    ],
)
def test_a_bad_url_is_refused_naming_the_node(url, message):
    with pytest.raises(ConfigurationError, match=message) as caught:
        node_for(url, 1.0)
    assert "zookeeper node" in str(caught.value)


def test_the_password_is_masked_and_min_replicas_refused():
    with pytest.raises(ConfigurationError, match="redlock_min_replicas does not apply") as caught:
        node_for("zookeeper://app:s3cret@zk-0:2181/x", 1.0, min_replicas=1)
    assert "s3cret" not in str(caught.value) and "app:***@" in str(caught.value)
    node = node_for("zookeeper://app:s3cret@zk-0:2181,zk-1:2181/x?prefix=locks", 1.0)
    assert (
        node.kind == "zookeeper"
        and node.name == "zookeeper://app:***@zk-0:2181,zk-1:2181/x?prefix=locks"
    )
    assert node.root == "/x/locks" and "s3cret" not in repr(node)


def test_a_node_without_kazoo_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "kazoo.client", None)
    with pytest.raises(ConfigurationError, match=r"celery_redlock\[zookeeper\]"):
        node_for("zookeeper://zk-0:2181", 1.0)


def test_znode_names_keep_every_key_apart():
    keys = [b"a:lock:{x}", b"a/b", b".", b"..", b"a%2Fb", b"\x00\xff"]
    names = [znode_name(k) for k in keys]
    assert len(set(names)) == len(keys)
    assert not any("/" in n or n in (".", "..") for n in names)


def test_no_member_answering_is_quorum_unavailable_within_the_budget():
    rl = Redlock([f"zookeeper://127.0.0.1:{free_port()}"], node_timeout=0.3, connect_timeout=0.5)
    began = time.monotonic()
    with pytest.raises(QuorumUnavailable, match="no session in time"):
        rl.try_acquire(NAME, ttl=5)
    assert time.monotonic() - began < 0.8 + 1.0


def test_a_client_clock_an_hour_ahead_finds_a_held_lock_held(zookeeper_node1):
    url = zookeeper_node1.urls[0]
    held = Redlock([url], node_timeout=1.0).acquire(NAME, ttl=5)
    ahead = Redlock([url], node_timeout=1.0, clock=lambda: time.time() + 3600)
    assert not isinstance(ahead.try_acquire(NAME, ttl=5), Lease)
    Redlock([url], node_timeout=1.0).release(held)


def test_digest_auth_keeps_the_keys_to_their_user(zookeeper_node1):
    host = zookeeper_node1.urls[0].split("://", 1)[1]
    mine = Redlock([f"zookeeper://app:s3cret@{host}/authed"], node_timeout=1.0)
    lease = mine.acquire(NAME, ttl=5)
    assert lease is not None
    for url in (f"zookeeper://{host}/authed", f"zookeeper://app:wrong@{host}/authed"):
        with pytest.raises(QuorumUnavailable, match="not allowed|authentication failed") as caught:
            Redlock([url], node_timeout=1.0).try_acquire(NAME, ttl=5)
        assert "s3cret" not in str(caught.value) and "wrong" not in str(caught.value)
    mine.release(lease)


def test_a_mixed_quorum_of_an_ensemble_and_redis_masters(zookeeper_node1, redis_nodes3):
    urls = [zookeeper_node1.urls[0], *redis_nodes3.urls[:2]]
    rl = Redlock(urls, node_timeout=1.0)
    first = rl.acquire(NAME, ttl=5)
    assert first is not None and rl.acquire(NAME, ttl=5) is None
    rl.release(first)
    again = rl.acquire(NAME, ttl=5)
    assert again.fencing_token > first.fencing_token
    rl.release(again)


def test_node_info_in_zookeepers_words(zookeeper_node1):
    rl = Redlock(zookeeper_node1.urls, node_timeout=1.0)
    (info,) = rl.node_info()
    assert info.error is None and info.kind == "zookeeper" and info.role == "ensemble"
    assert info.version.startswith("zookeeper 3.")
    z = info.specific
    assert isinstance(z, ZookeeperInfo) and z.members == 3 and z.quorum == 2
    assert sorted(mode for _, mode in z.modes) == ["follower", "follower", "leader"]
    assert [str(c) for c in checks(info)] == ["members 3 (quorum 2)", f"leader {z.leader}"]


def test_health_rules_in_zookeepers_terms():
    one = NodeInfo(
        "zk", kind="zookeeper", specific=ZookeeperInfo(1, 1, "h:1", (("h:1", "standalone"),))
    )
    assert any("1 member" in line for line in findings([one], 1.0))
    down = ZookeeperInfo(3, 1, None, (("a:1", "down"), ("b:1", "down"), ("c:1", "follower")))
    lines = findings([NodeInfo("zk", kind="zookeeper", specific=down)], 1.0)
    assert any("2 of 3 members down: no quorum" in line for line in lines)
    assert any("no leader" in line for line in lines)
    refused = ZookeeperInfo(3, 0, None, (("a:1", "?"), ("b:1", "?"), ("c:1", "?")))
    lines = findings([NodeInfo("zk", kind="zookeeper", specific=refused)], 1.0)
    assert any("refuse the srvr" in line for line in lines)
    assert not any(c.unsafe for c in checks(NodeInfo("zk", kind="zookeeper", specific=refused)))
