"""Redlock's read-only views for the tools: inspect_key, agreed, scan, read_claim,
force_release, node_info, node_name.

fakeredis nodes, one ``FakeServer`` each, and memory nodes (``memory://``);
``server.connected = False`` is a dead node.
"""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest

from celery_redlock.exceptions import ConfigurationError
from celery_redlock.redlock import (
    ClaimView,
    Deletion,
    Holder,
    NodeInfo,
    NodeView,
    Redlock,
    make_owner,
    node_name,
)
from celery_redlock.testing.memory import MemoryNode, MemoryNodes


@pytest.fixture(params=["fakeredis", "memory"])
def servers(request) -> Iterator[list]:
    if request.param == "memory":
        with MemoryNodes(3) as nodes:
            yield list(nodes)
        return
    yield [fakeredis.FakeServer() for _ in range(3)]


def on_memory(servers) -> bool:
    return isinstance(servers[0], MemoryNode)


@pytest.fixture
def peek(servers) -> list:
    """Decoded clients that look at the nodes behind the Redlock's back."""
    if on_memory(servers):
        return [node.client() for node in servers]
    return [fakeredis.FakeRedis(server=s, decode_responses=True) for s in servers]


def nodes_of(servers) -> list:
    if on_memory(servers):
        return [node.url for node in servers]
    return [fakeredis.FakeRedis(server=s) for s in servers]


@pytest.fixture
def rl(servers) -> Redlock:
    return Redlock(nodes_of(servers), key_prefix="t", node_timeout=1.0)  # connects on a thread


def test_inspect_key_gives_each_node_its_holder_ttl_and_fence(rl, servers):
    lease = rl.acquire("job", ttl=10, owner=make_owner("tid"))
    servers[2].connected = False
    views = rl.inspect_key(lease.key, lease.fence_key)
    assert [type(v) for v in views] == [NodeView] * 3
    assert [v.node for v in views] == [node.name for node in rl.nodes]
    for view in views[:2]:
        assert view.holder == lease.owner and view.error is None
        assert 0 < view.pttl_ms <= 10_000
        assert int(view.fence) == lease.fencing_token
    assert views[2].holder is None and views[2].error
    assert rl.agreed(views) == Holder(lease.owner, pytest.approx(views[0].pttl_ms / 1000, abs=0.1))


def test_inspect_key_of_a_free_key_and_without_a_fence_key(rl):
    views = rl.inspect_key("t:lock:{free}")
    assert views == [NodeView(node.name) for node in rl.nodes]
    assert rl.agreed(views) == Holder(None, None)


def test_inspect_key_does_not_ask_skipped_nodes(rl, peek):
    peek[0].set("t:beat:e:1", "v", px=5000)
    skip = {rl.nodes[0].name: "hung earlier"}
    views = rl.inspect_key("t:beat:e:1", skip=skip)
    assert views[0] == NodeView(rl.nodes[0].name, error="hung earlier")
    assert views[1].holder is None and views[1].error is None


def test_agreed_needs_a_quorum_of_all_nodes_not_of_those_that_answered(rl):
    name = rl.nodes[0].name
    one = [NodeView(name, "a", 900), NodeView(name, error="down"), NodeView(name, error="down")]
    assert rl.agreed(one) == Holder(None, None)
    two = [NodeView(name, "a", 900), NodeView(name, "a", 500), NodeView(name, "b", 100)]
    assert rl.agreed(two) == Holder("a", 0.5)


def test_scan_finds_names_of_one_kind_matching_the_pattern(rl, peek):
    peek[0].set("t:lock:a:{1}", "x")
    peek[1].set("t:lock:a:{1}", "x")
    peek[1].set("t:lock:b:{2}", "x")
    peek[2].set("t:fence:a:{1}", "5")
    peek[2].set("other:lock:a:{3}", "x")
    found = rl.scan("lock")
    assert found.names == ["a:{1}", "b:{2}"] and found.errors == {} and not found.truncated
    assert rl.scan("lock", "a:*").names == ["a:{1}"]
    assert rl.scan("fence").names == ["a:{1}"]


def test_scan_stops_at_the_limit_and_reports_failed_nodes(rl, peek, servers):
    for i in range(5):
        peek[0].set(f"t:beat:e:{i}", "v")
    found = rl.scan("beat", limit=3, count=1)
    assert len(found.names) == 3 and found.truncated
    servers[1].connected = False
    found = rl.scan("beat")
    assert len(found.names) == 5 and list(found.errors) == [rl.nodes[1].name]


def test_scan_escapes_glob_characters_of_the_prefix(servers, peek):
    rl = Redlock(nodes_of(servers), key_prefix="p*")
    peek[0].set("p*:lock:a", "x")
    peek[0].set("pX:lock:b", "x")
    assert rl.scan().names == ["a"]


def test_read_claim_after_claim(rl, servers):
    assert rl.claim("beat:e:1", "mine", ttl=5)
    assert rl.read_claim("beat:e:1") == ClaimView("mine", frozenset({"mine"}))
    assert rl.read_claim("beat:e:2") == ClaimView(None, frozenset())


def test_read_claim_counts_silent_nodes_toward_candidates(rl, peek, servers):
    peek[0].set("t:beat:e:1", "theirs")
    assert rl.read_claim("beat:e:1") == ClaimView(None, frozenset())
    servers[2].connected = False
    assert rl.read_claim("beat:e:1") == ClaimView(None, frozenset({"theirs"}))


def test_force_release_deletes_whatever_the_holder_and_keeps_the_fence(rl, peek, servers):
    lease = rl.acquire("job", ttl=10)
    peek[2].delete(lease.key)
    servers[1].connected = False
    deletions = rl.force_release("job")
    names = [node.name for node in rl.nodes]
    assert deletions[0] == Deletion(names[0], True, None)
    assert deletions[1].node == names[1] and not deletions[1].deleted and deletions[1].error
    assert deletions[2] == Deletion(names[2], False, None)
    assert peek[0].get(lease.key) is None and peek[0].get(lease.fence_key) is not None


def test_node_info_of_live_and_dead_nodes(rl, servers):
    # fakeredis answers PING but has no INFO: the INFO fields of a real server
    # are checked by the ``celery redlock nodes`` tests.
    servers[1].connected = False
    infos = rl.node_info()
    assert [type(i) for i in infos] == [NodeInfo] * 3
    if on_memory(servers):
        assert infos[0].error is None and infos[0].version.startswith("memory, ")
    else:
        assert infos[0].error.startswith("INFO failed: ") and infos[0].latency > 0
    assert infos[1].error and not infos[1].error.startswith("INFO") and infos[1].version == "-"
    rl.close()


def test_node_name_masks_passwords_and_names_clients():
    assert node_name("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert node_name(fakeredis.FakeRedis(server=fakeredis.FakeServer())).startswith("redis://")
    with pytest.raises(ConfigurationError):
        node_name(42)  # type: ignore[arg-type]
