"""Every invalid Redlock argument is a clear error that names it."""

from __future__ import annotations

import math
import socket
import time

import fakeredis
import pytest
import redis

from celery_redlock.exceptions import ConfigurationError, QuorumUnavailable
from celery_redlock.redlock import Redlock

URL = "redis://127.0.0.1:1/0"  # nothing listens there; construction never connects


@pytest.fixture
def fake_nodes() -> list[fakeredis.FakeRedis]:
    return [fakeredis.FakeRedis(server=fakeredis.FakeServer()) for _ in range(3)]


@pytest.fixture
def rl(fake_nodes) -> Redlock:
    return Redlock(fake_nodes)


@pytest.mark.parametrize("nodes", [[], (), None, URL, b"redis://h:1", 42])
def test_no_nodes(nodes):
    with pytest.raises(ConfigurationError, match="node"):
        Redlock(nodes)


@pytest.mark.parametrize(
    "urls, named",
    [
        (
            ["redis://127.0.0.1:7001/0", "redis://127.0.0.1:7002/0", "redis://127.0.0.1:7001/0"],
            "127.0.0.1:7001",
        ),
        (["redis://127.0.0.1:7001/0", "redis://127.0.0.1:7001"], "127.0.0.1:7001"),  # db 0
        (["redis://example.com", "redis://example.com:6379/0", "redis://o:1"], "example.com"),
        (["unix:///tmp/r.sock", "unix:///tmp/r.sock?db=0", "redis://other:1"], "/tmp/r.sock"),
    ],
)
def test_duplicated_node_url(urls, named):
    with pytest.raises(ConfigurationError, match="listed twice") as info:
        Redlock(urls)
    assert named in str(info.value)


def test_distinct_dbs_and_ports_are_distinct_nodes():
    Redlock(["redis://h:1/0", "redis://h:1/1", "redis://h:2/0"])


def test_duplicated_password_url_is_named_without_the_password():
    url = "redis://:s3cret@127.0.0.1:7001/0"
    with pytest.raises(ConfigurationError, match="listed twice") as info:
        Redlock([url, "redis://127.0.0.1:7002/0", url])
    assert "127.0.0.1:7001" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_duplicated_node_client(fake_nodes):
    server = fake_nodes[0].connection_pool.connection_kwargs["server"]
    same_server = fakeredis.FakeRedis(server=server)
    with pytest.raises(ConfigurationError, match="listed twice"):
        Redlock([fake_nodes[0], fake_nodes[1], same_server])
    with pytest.raises(ConfigurationError, match="listed twice"):
        Redlock([fake_nodes[0], fake_nodes[1], fake_nodes[0]])
    client = redis.Redis(host="127.0.0.1", port=7001)
    with pytest.raises(ConfigurationError, match="listed twice"):
        Redlock([client, "redis://127.0.0.1:7001/0", "redis://127.0.0.1:7002/0"])


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:6379", "127.0.0.1:6379", "localhost:6379", "tcp://h:1", ""]
)
def test_bad_url_scheme(url):
    with pytest.raises(ConfigurationError, match="redis://, rediss://, unix://") as info:
        Redlock([url])
    assert repr(url) in str(info.value)


def test_bad_url_port():
    with pytest.raises(ConfigurationError, match="redis://h:notaport"):
        Redlock(["redis://h:notaport"])


@pytest.mark.parametrize(
    "node", [object(), 42, {"host": "h"}, ["redis://h:1"], redis.ConnectionPool()]
)
def test_a_node_that_is_not_a_client(node):
    with pytest.raises(ConfigurationError, match="URL or a redis.Redis client") as info:
        Redlock([node])
    assert type(node).__name__ in str(info.value)


BAD_DURATIONS = [0, -1, -0.001, None, "5", True, math.nan, math.inf, [1]]


@pytest.mark.parametrize("value", BAD_DURATIONS)
@pytest.mark.parametrize("name", ["node_timeout", "connect_timeout", "fence_retention"])
def test_non_positive_client_durations(name, value):
    if value is None and name != "fence_retention":
        return  # unset: each node's kind's default (test_kind_default_timeouts)
    with pytest.raises(ConfigurationError, match=name):
        Redlock([URL], **{name: value})


def test_kind_default_timeouts():
    """Unset, each node takes its kind's defaults; a value set wins."""
    rl = Redlock([URL])
    assert (rl.node_timeout, rl.connect_timeout) == (0.05, 1.0)
    assert [(n.timeout, n.connect_timeout) for n in rl.nodes] == [(0.05, 1.0)]
    set_ = Redlock([URL], node_timeout=0.2, connect_timeout=3.0)
    assert (set_.node_timeout, set_.connect_timeout) == (0.2, 3.0)
    assert [(n.timeout, n.connect_timeout) for n in set_.nodes] == [(0.2, 3.0)]


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_non_positive_ttl(rl, value):
    with pytest.raises(ConfigurationError, match="ttl"):
        rl.acquire("job", ttl=value)
    with pytest.raises(ConfigurationError, match="ttl"):
        rl.try_acquire("job", ttl=value)
    with pytest.raises(ConfigurationError, match="ttl"):
        rl.claim("slot", "v", ttl=value)
    lease = rl.acquire("job", ttl=5)
    if value is not None:  # None means "the lease's own TTL"
        with pytest.raises(ConfigurationError, match="ttl"):
            rl.extend(lease, ttl=value)
    assert not lease.lost  # a rejected call did not touch the lease


@pytest.mark.parametrize("value", [-1, -0.001, "1", True, math.nan])
def test_bad_blocking_timeout(rl, value):
    with pytest.raises(ConfigurationError, match="timeout"):
        rl.acquire("job", ttl=5, blocking=True, timeout=value)


@pytest.mark.parametrize("value", [-0.01, 1, 1.5, "0.01", math.nan, None, True])
def test_drift_factor_out_of_range(value):
    with pytest.raises(ConfigurationError, match="drift_factor"):
        Redlock([URL], drift_factor=value)


@pytest.mark.parametrize("value", ["", None, 42, "a{b", "a}b", "{tag}", b"redlock"])
def test_bad_key_prefix(value):
    with pytest.raises(ConfigurationError, match="key_prefix"):
        Redlock([URL], key_prefix=value)


@pytest.mark.parametrize("name", ["", None, 42, b"job"])
def test_bad_lock_name(rl, name):
    with pytest.raises(ConfigurationError, match="lock name"):
        rl.acquire(name, ttl=5)


@pytest.mark.parametrize("n", [2, 4, 6])
def test_even_number_of_nodes_warns(n):
    urls = [f"redis://127.0.0.1:{7000 + i}/0" for i in range(n)]
    with pytest.warns(RuntimeWarning, match="odd number"):
        rl = Redlock(urls)
    assert rl.quorum == n // 2 + 1


@pytest.mark.parametrize("n", [1, 3, 5])
def test_odd_number_of_nodes_does_not_warn(n):
    # filterwarnings=error turns any warning here into a failure
    rl = Redlock([f"redis://127.0.0.1:{7000 + i}/0" for i in range(n)])
    assert rl.quorum == n // 2 + 1


def test_valid_extremes_are_accepted(rl):
    Redlock([URL], drift_factor=0)
    Redlock([URL], drift_factor=0.99, node_timeout=1e-3, fence_retention=1)
    assert rl.acquire("job", ttl=0.5, blocking=True, timeout=0) is not None
    assert rl.acquire("job2", ttl=1, blocking=True, timeout=math.inf) is not None


def test_unresolvable_host_fails_fast_at_first_use_naming_the_node(monkeypatch):
    url = "redis://no-such-host.invalid:6379/0"
    lookups = []
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        lookups.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    rl = Redlock([url])  # no connection at construction
    for attempt in range(3):
        start = time.monotonic()
        with pytest.raises(QuorumUnavailable) as info:
            rl.acquire("job", ttl=5)
        elapsed = time.monotonic() - start
        assert list(info.value.errors) == [url]
        assert url in str(info.value)
        assert info.value.quorum == 1 and info.value.total == 1
        # getaddrinfo is not bounded by the node timeout: one lookup per round of
        # the attempt (two), never a retry loop; 3x slack on the time they take
        assert len(lookups) <= 2 * (attempt + 1), lookups
        assert elapsed < 3.0, f"failing on an unresolvable host took {elapsed:.3f}s"


def test_unresolvable_host_among_good_nodes_is_just_one_failure(fake_nodes):
    url = "redis://no-such-host.invalid:6379/0"
    rl = Redlock([fake_nodes[0], url, fake_nodes[1]])
    lease = rl.acquire("job", ttl=5)
    assert lease is not None
    assert "error" in rl.inspect("job")[1]
