"""What an etcd lock node does of its own, on real etcd servers: bad input refused
with the node named, a TTL below etcd's minimum refused, expiry that no
client clock decides, and the lease a key hangs on."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from celery_redlock.core import Lease, Redlock, check_ttl
from celery_redlock.core.nodes.etcd import EtcdNode
from celery_redlock.core.nodes.etcd.exchange import Connection
from celery_redlock.exceptions import ConfigurationError, QuorumUnavailable
from celery_redlock.testing.etcd import EtcdCluster, api
from celery_redlock.testing.nodes import free_port

pytestmark = pytest.mark.integration

NAME = "pay"


def test_a_url_with_no_reachable_member_is_an_error_naming_the_node():
    url = f"etcd://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    rl = Redlock([url], node_timeout=0.5)
    with pytest.raises(QuorumUnavailable, match="no member answers") as caught:
        rl.try_acquire(NAME, ttl=5)
    assert url in str(caught.value)


def test_endpoints_of_two_clusters_are_refused(etcd_node1):
    with EtcdCluster(1) as other:
        url = etcd_node1.urls[0] + "," + other[0].endpoint
        rl = Redlock([url], node_timeout=2.0)
        with pytest.raises(QuorumUnavailable, match="members of different clusters"):
            rl.try_acquire(NAME, ttl=5)


def test_an_etcd_without_its_v3_gateway_is_named():
    with EtcdCluster(1, extra_args=["--enable-grpc-gateway=false"]) as cluster:
        rl = Redlock([cluster.url], node_timeout=2.0)
        with pytest.raises(QuorumUnavailable, match="v3 API") as caught:
            rl.try_acquire(NAME, ttl=5)
        assert not caught.value.heals  # no outage: the URL names another service


def test_auth_required_but_missing_is_named_and_a_password_in_the_url_works():
    with EtcdCluster(1) as cluster:
        base = f"http://{cluster[0].endpoint}/v3"
        api(f"{base}/auth/user/add", {"name": "root", "password": "s3cret"})
        api(f"{base}/auth/user/grant", {"user": "root", "role": "root"})
        api(f"{base}/auth/enable", {})
        with pytest.raises(QuorumUnavailable, match="requires authentication") as caught:
            Redlock([cluster.url], node_timeout=2.0).try_acquire(NAME, ttl=5)
        assert not caught.value.heals  # no outage: it cannot end without a fix
        wrong = cluster.url.replace("etcd://", "etcd://root:nope@")
        with pytest.raises(QuorumUnavailable, match="authentication failed") as caught:
            Redlock([wrong], node_timeout=2.0).try_acquire(NAME, ttl=5)
        assert "nope" not in str(caught.value)  # the password is masked
        assert not caught.value.heals
        rl = Redlock([cluster.url.replace("etcd://", "etcd://root:s3cret@")], node_timeout=2.0)
        lease = rl.acquire(NAME, ttl=5)
        assert lease is not None and rl.acquire(NAME, ttl=5) is None
        rl.release(lease)


def test_a_ttl_below_etcds_minimum_is_refused_naming_it(etcd_node1):
    nodes = Redlock(etcd_node1.urls, node_timeout=1.0).nodes
    with pytest.raises(ConfigurationError, match=r"lock_ttl=1\.5s .* minimum lease TTL .* 2 s"):
        check_ttl(nodes, 1.5, "lock_ttl")
    check_ttl(nodes, 2.0, "lock_ttl")


def test_min_replicas_does_not_apply():
    with pytest.raises(ConfigurationError, match="majority"):
        EtcdNode("etcd://127.0.0.1:2379", 1.0, min_replicas=1)


def test_a_client_clock_an_hour_ahead_does_not_see_a_held_lock_as_free(etcd_node1, monkeypatch):
    """Whether a key is held is etcd's lease to say: a client whose wall clock
    runs an hour ahead still finds the lock held, and its PTTL stays within the TTL."""
    holder = Redlock(etcd_node1.urls, node_timeout=1.0)
    lease = holder.acquire(NAME, ttl=10)
    assert lease is not None
    ahead = time.time() + 3600
    monkeypatch.setattr("celery_redlock.core.nodes.etcd.store.time.time", lambda: ahead)
    skewed = Redlock(etcd_node1.urls, node_timeout=1.0)
    assert skewed.acquire(NAME, ttl=10) is None
    with etcd_node1[0].client() as keys:
        assert 0 < keys.pttl(lease.key) <= 10_000
    monkeypatch.undo()
    holder.release(lease)
    assert skewed.acquire(NAME, ttl=10) is not None


def test_a_lock_key_hangs_on_a_lease_that_outlives_its_ttl(etcd_node1):
    """The key's lease has the TTL's whole seconds plus one: a key never expires
    before its TTL, and disappears on its own after it (no client deletes it)."""
    rl = Redlock(etcd_node1.urls, node_timeout=1.0)
    began = time.monotonic()
    lease = rl.acquire(NAME, ttl=2.5)
    assert lease is not None
    base = f"http://{etcd_node1[0].members[0].endpoint}/v3"
    got = api(
        f"{base}/kv/range", {"key": base64.b64encode(b"redlock/" + lease.key.encode()).decode()}
    )
    lease_id = got["kvs"][0]["lease"]
    granted = int(api(f"{base}/lease/timetolive", {"ID": lease_id})["grantedTTL"])
    assert granted == 4  # ceil(2.5) + 1
    while rl.holder(NAME).owner is not None:
        assert time.monotonic() - began < 15  # 4 s, plus etcd's 0.5 s expiry sweep and slack
        time.sleep(0.1)
    assert time.monotonic() - began >= 2.5


def _answered(rl: Redlock, name: str, seconds: float = 20.0):
    """``try_acquire`` once the node answers (a member still starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return rl.try_acquire(name, ttl=5)
        except QuorumUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_etcds_with_a_client_certificate(tmp_path):
    """``etcds://`` speaks TLS to a member that requires a client certificate:
    with the CA and the client's certificate it locks; without the certificate,
    or over plain HTTP, the node does not answer; with another CA its
    certificate is not verified, which cannot heal."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1"), ca.issue_cert("client.example")
    files = {}
    for name, blob in {
        "ca": ca.cert_pem,
        "server": server.cert_chain_pems[0],
        "server-key": server.private_key_pem,
        "client": client.cert_chain_pems[0],
        "client-key": client.private_key_pem,
        "other-ca": trustme.CA().cert_pem,
    }.items():
        files[name] = str(tmp_path / f"{name}.pem")
        blob.write_to_path(files[name])
    with EtcdCluster(1, start=False) as cluster:
        member = cluster[0]
        https = f"https://{member.endpoint}"
        member.launch(
            f"{member.name}={member.peer_url}",
            cluster.token,
            ["--listen-client-urls", https, "--advertise-client-urls", https,
             "--cert-file", files["server"], "--key-file", files["server-key"],
             "--client-cert-auth", "--trusted-ca-file", files["ca"]],
        )  # fmt: skip
        query = f"ca={files['ca']}&cert={files['client']}&key={files['client-key']}"
        rl = Redlock([f"etcds://{member.endpoint}?{query}"], node_timeout=2.0)
        lease = _answered(rl, NAME)
        assert isinstance(lease, Lease)
        assert rl.acquire(NAME, ttl=5) is None
        with pytest.raises(QuorumUnavailable):
            Redlock([f"etcds://{member.endpoint}?ca={files['ca']}"], node_timeout=1.0).try_acquire(
                NAME, ttl=5
            )
        with pytest.raises(QuorumUnavailable):
            Redlock([f"etcd://{member.endpoint}"], node_timeout=1.0).try_acquire(NAME, ttl=5)
        other = query.replace(files["ca"], files["other-ca"])
        with pytest.raises(QuorumUnavailable, match="TLS") as caught:
            Redlock([f"etcds://{member.endpoint}?{other}"], node_timeout=1.0).try_acquire(
                NAME, ttl=5
            )
        assert not caught.value.heals  # a certificate not verified is no outage
        rl.release(lease)


def test_conflicting_writers_retry_and_the_limit_holds(etcd_node1):
    """Six clients (each its own view of the keys) take permits of a limit of 2 at
    once: their Txns conflict and run again, none of them is taken for "held" or
    "not answering", and never more than 2 hold a permit."""
    clients = [Redlock(etcd_node1.urls, node_timeout=2.0) for _ in range(6)]
    inside = peak = 0
    guard = threading.Lock()
    errors: list[BaseException] = []
    grants = []

    def loop(rl: Redlock) -> None:
        nonlocal inside, peak
        end = time.monotonic() + 3.0
        try:
            while time.monotonic() < end:
                lease = rl.try_acquire("api", ttl=5, limit=2)
                if not isinstance(lease, Lease):
                    time.sleep(0.005)
                    continue
                with guard:
                    inside += 1
                    peak = max(peak, inside)
                    grants.append(lease.fencing_token)
                time.sleep(0.005)
                with guard:
                    inside -= 1
                rl.release(lease)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(rl,)) for rl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert peak == 2 and len(grants) >= 20
    assert sum(rl.nodes[0].store.conflicts for rl in clients) > 0  # the retry path ran


def test_a_renewal_of_more_leases_than_one_txn_takes_goes_in_parts(etcd_node1):
    """One EXTEND of 250 leases (etcd takes 128 operations a Txn): every one renewed,
    a key not held refused, as in one call on Redis."""
    from celery_redlock.core.nodes import scatter, scripts

    rl = Redlock(etcd_node1.urls, node_timeout=5.0)
    leases = [rl.acquire(f"n{i}", ttl=10, fence=False) for i in range(250)]
    keys, args = [], []
    for lease in leases:
        keys.append(lease.key)
        args += [lease.owner, 30_000]
    keys.append("redlock:lock:{nobody}")
    args += ["someone", 30_000]
    got = scatter((scripts.EXTEND, keys, args), rl.nodes, 10.0)[0]
    assert got == [1] * 250 + [0]
    with etcd_node1[0].client() as c:
        assert 20_000 < c.pttl(leases[-1].key) <= 30_000


def test_a_large_reply_comes_in_chunks_and_is_read_whole(etcd_node1, monkeypatch):
    """etcd's gateway writes a reply past a few KB in chunks: a scan of many keys."""
    chunked = []
    read_chunk = Connection._chunk
    monkeypatch.setattr(Connection, "_chunk", lambda self: chunked.append(1) or read_chunk(self))
    host, _, port = etcd_node1.urls[0].split("//")[1].split(",")[0].rpartition(":")
    conn = Connection(host, int(port))
    conn.connect(2.0)
    b = base64.b64encode
    for i in range(300):
        put = {"key": b(b"big/%03d" % i).decode(), "value": b(b"x" * 100).decode()}
        assert conn.post("/v3/kv/put", json.dumps(put).encode(), None, 2.0)[0] == 200
    assert not chunked  # small replies carry their length
    span = {"key": b(b"big/").decode(), "range_end": b(b"big0").decode()}
    status, body = conn.post("/v3/kv/range", json.dumps(span).encode(), None, 2.0)
    assert status == 200 and chunked
    assert [base64.b64decode(kv["key"]) for kv in json.loads(body)["kvs"]] == [
        b"big/%03d" % i for i in range(300)
    ]
    # the connection goes on after a chunked reply
    assert conn.post("/v3/kv/deleterange", json.dumps(span).encode(), None, 2.0)[0] == 200
    conn.close()
