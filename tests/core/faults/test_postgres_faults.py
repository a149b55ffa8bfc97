"""PostgreSQL lock nodes under the faults of their own kind, on real servers:
a crash and restart with leases held, a paused server, backends killed in the
middle of rounds, pgbouncer's transaction pooling, the schema's life
(created on first use, refused at another version, applied by the CLI), and
names used once swept away by the calls that follow."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest

from celery_redlock.core import Redlock
from celery_redlock.core.nodes import postgres
from celery_redlock.core.nodes.postgres.schema import VERSION
from celery_redlock.exceptions import QuorumUnavailable
from tests.support import netproxy
from tests.support.section import Section

pytestmark = pytest.mark.integration

NAME = "pay"
#: The checkout, where a child process imports the package from.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def warmed(rl: Redlock) -> None:
    """One round passed on every node: each process's first statements on a new
    connection plan the node's functions, and on a loaded host (fresh from a
    crash's recovery, say) that may outlast a short node timeout: go again."""
    deadline = time.monotonic() + 60
    while True:
        try:
            rl.release(rl.acquire("warm", ttl=5))
        except QuorumUnavailable:
            assert time.monotonic() < deadline, "no round passed in 60 s"
            time.sleep(0.2)
            continue
        return


def test_a_crash_keeps_the_leases_held_and_tokens_keep_growing(postgres_nodes3):
    rl = Redlock(postgres_nodes3.urls, node_timeout=2.0)  # not about the timeout
    held = rl.acquire(NAME, ttl=60)
    assert held is not None
    for server in postgres_nodes3:
        server.crash()  # pg_ctl stop -m immediate: no shutdown checkpoint
    for server in postgres_nodes3:
        server.start()  # crash recovery replays the committed grants
    assert rl.holder(NAME).owner == held.owner
    assert rl.acquire(NAME, ttl=5) is None  # still held: no second holder
    rl.release(held)
    after = rl.acquire(NAME, ttl=5)
    assert after is not None and after.fencing_token > held.fencing_token
    rl.release(after)


def test_a_release_does_not_wait_for_its_flush_and_a_crash_costs_only_the_lease(
    postgres_nodes3,
):
    """A plain release commits without its WAL flush (the acquire keeps it): a crash
    may lose the release, which leaves the lease to run out, never a second holder."""
    rl = Redlock(postgres_nodes3.urls, node_timeout=2.0)  # not about the timeout
    rl.release(rl.acquire("warm", ttl=5))  # the schema, made on first use
    with postgres_nodes3[0].connect() as conn:
        for call, flushed in [
            ("redlock.acquire_plain('{s}:lock', '{s}:fence', 'me', 5000, '', '0')", "on"),
            ("redlock.release_plain('{s}:lock', 'me')", "off"),
        ]:
            with conn.transaction():
                conn.execute(f"SELECT {call}")
                assert conn.execute("SHOW synchronous_commit").fetchone()[0] == flushed
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"  # its own only
    held = rl.acquire(NAME, ttl=2)
    assert held is not None
    rl.release(held)
    for server in postgres_nodes3:
        server.crash()
        server.start()
    assert rl.holder(NAME).owner in (None, held.owner)  # the release came back, or not
    after = rl.acquire(NAME, ttl=5, blocking=True, timeout=30)  # at most the 2 s lease's wait
    assert after is not None and after.fencing_token > held.fencing_token
    rl.release(after)


def test_a_paused_server_answers_nothing_and_the_round_ends(postgres_nodes3):
    """SIGSTOP on every process of one server: the quorum carries on; with two
    paused, the round ends as "not answering", never a hang."""
    # 1 s: the two that answer must, on a loaded host too; the paused ones never do
    rl = Redlock(postgres_nodes3.urls, node_timeout=1.0)
    warmed(rl)  # connections open before the pause
    postgres_nodes3.pause(0)
    lease = rl.acquire(NAME, ttl=5)
    assert lease is not None
    rl.release(lease)
    postgres_nodes3.pause(1)
    began = time.monotonic()
    with pytest.raises(QuorumUnavailable, match="no reply"):
        rl.try_acquire("other", ttl=5)
    # one round of 1 s per node at once (plus a loaded host's slack), not a hang
    assert time.monotonic() - began < 5
    postgres_nodes3.resume(0)
    postgres_nodes3.resume(1)


#: A process that locks once through the proxy, then again when told (a line
#: on stdin), printing what the second round gave. A process of its own: libpq
#: holds the interpreter's lock while it waits, so a hang stops a whole process.
CUT_CLIENT = """
import sys
import time
from celery_redlock.core import Redlock
from celery_redlock.exceptions import QuorumUnavailable

rl = Redlock([sys.argv[1]], node_timeout=0.3)
for _ in range(100):  # a loaded host's first round may outlast 0.3 s: go again
    try:
        rl.release(rl.acquire("warm", ttl=5))
        break
    except QuorumUnavailable:
        time.sleep(0.2)
print("warm", flush=True)
sys.stdin.readline()
try:
    print("granted" if rl.try_acquire("pay", ttl=5) else "refused")
except QuorumUnavailable as exc:
    print(exc)
"""


def test_a_reply_cut_off_part_way_costs_one_timeout(postgres_node1):
    """A reply that stops short of its end (the connection lost part-way) is a
    node not answering within the timeout, never a wait for the rest: libpq
    hands out each result as it completes and would block for the next."""
    (url,) = postgres_node1.urls
    parts = urlsplit(url)
    proxy = netproxy.NodeProxy(parts.hostname, parts.port)
    client = subprocess.Popen(
        [sys.executable, "-c", CUT_CLIENT, proxy.url(url)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )  # fmt: skip
    try:
        assert client.stdout.readline() == "warm\n"  # connected and prepared before the cut
        proxy.set(netproxy.REPLY_CUT)
        try:
            said, _ = client.communicate("go\n", timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the round waited for the rest of a cut-off reply")
        assert "no reply in 0.3s" in said, said
    finally:
        client.kill()
        proxy.close()


def test_backends_killed_in_the_middle_of_rounds_lose_nothing(postgres_nodes3):
    """pg_terminate_backend on every client backend, again and again, while
    four threads take one name: the grants never overlap and the tokens
    strictly grow in grant order."""
    rl = Redlock(postgres_nodes3.urls, node_timeout=0.5)
    stop = threading.Event()
    section = Section()
    grants = section.grants

    def take() -> None:
        while not stop.is_set():
            try:
                lease = rl.acquire(NAME, ttl=5, blocking=True, timeout=1)
            except QuorumUnavailable:
                continue
            if lease is None:
                continue
            with section.held(lease.fencing_token):
                pass
            rl.release(lease)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    killed = 0
    failsafe = time.monotonic() + 120  # a hang, not a slow host: the run ends on the counts
    try:
        while (len(grants) < 100 or killed < 20) and time.monotonic() < failsafe:
            killed += sum(server.kill_backends() for server in postgres_nodes3)
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert len(grants) >= 100 and killed >= 20
    assert section.overlaps == 0
    assert grants == sorted(set(grants))  # strictly growing, in the order granted


def test_transaction_pooling_keeps_exclusion_and_growing_tokens(postgres_node1):
    """pgbouncer with two server connections in transaction pooling, six threads
    on one name, each with its own client: every call is one transaction, so
    nothing depends on which server connection ran it."""
    from celery_redlock.testing.pgbouncer import PgBouncer

    section = Section()
    with PgBouncer(postgres_node1[0], pool_size=2) as bouncer:

        def take() -> None:
            rl = Redlock([bouncer.url], node_timeout=1.0)
            for _ in range(25):
                lease = rl.acquire(NAME, ttl=5, blocking=True, timeout=10)
                assert lease is not None  # else the count below comes up short
                with section.held(lease.fencing_token):
                    pass
                rl.release(lease)

        threads = [threading.Thread(target=take) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    grants = section.grants
    assert section.overlaps == 0
    assert len(grants) == 150 and grants == sorted(set(grants))


def test_names_used_once_are_swept_away_by_later_calls(postgres_node1):
    """Every name leaves a fence row for its retention; once those expired, the
    calls on other names clear them (one write in eight clears up to 32: four a
    write), on the common path of a lock and on the general one alike."""
    server = postgres_node1[0]
    rows = "SELECT count(*) FROM redlock.kv"
    # not about a round's timeout: a busy host's stalls get room
    rl = Redlock(postgres_node1.urls, node_timeout=3.0, fence_retention=3)
    plain = Redlock(postgres_node1.urls, node_timeout=3.0, fencing=False)
    for limit in (1, 2):  # the lock's own statements, then the general one (a permit)
        before = server.sql(rows)[0][0]
        for i in range(300):
            rl.release(rl.acquire(f"once-{limit}-{i}", ttl=5))
        assert server.sql(rows)[0][0] - before == 300  # a fence row each, none expired yet
        time.sleep(3.2)
        for _ in range(300):  # 600 writes: about 2,400 rows' worth of clearing
            plain.release(plain.acquire("busy", ttl=5, limit=limit))
        assert server.sql(rows)[0][0] <= 10


def test_the_schema_is_made_on_first_use_and_another_version_is_refused(postgres_node1):
    server = postgres_node1[0]
    server.sql("DROP SCHEMA IF EXISTS redlock CASCADE")
    # making the schema takes longer than a 50 ms node timeout (another installer
    # holds the installers' lock for 0.3 s): it has a budget of its own, and the
    # call's timeout starts once the schema is there
    other = server.connect()
    other.execute("SELECT pg_advisory_lock(hashtextextended('celery_redlock schema', 0))")
    threading.Timer(0.3, other.close).start()  # its session's end frees the lock
    rl = Redlock(postgres_node1.urls, node_timeout=0.05)
    lease = rl.try_acquire(NAME, ttl=5)
    assert lease is not None and not isinstance(lease, Exception)
    rl.release(lease)
    assert server.sql("SELECT version FROM redlock.meta") == [(VERSION,)]
    server.sql("UPDATE redlock.meta SET version = version + 1")
    again = Redlock(postgres_node1.urls, node_timeout=1.0)  # a new process, in effect
    for node in again.nodes:
        node._checked = False
    with pytest.raises(QuorumUnavailable, match="celery redlock schema --apply"):
        again.try_acquire(NAME, ttl=5)
    server.sql("UPDATE redlock.meta SET version = %s", VERSION)


def test_a_role_that_may_not_create_the_schema_is_told_what_to_run(postgres_node1):
    server = postgres_node1[0]
    server.sql("DROP SCHEMA IF EXISTS redlock CASCADE")
    server.sql("DROP ROLE IF EXISTS crl_app")
    server.sql("CREATE ROLE crl_app LOGIN")
    server.sql("REVOKE CREATE ON DATABASE postgres FROM PUBLIC")
    url = server.url.replace("postgres@", "crl_app@")
    rl = Redlock([url], node_timeout=1.0)
    with pytest.raises(QuorumUnavailable, match="cannot create schema 'redlock'.*schema --apply"):
        rl.try_acquire(NAME, ttl=5)
    # the DBA applies the printed SQL; the role may then use what it may not create
    postgres.install(Redlock(postgres_node1.urls, node_timeout=1.0).nodes[0])
    server.sql("GRANT USAGE ON SCHEMA redlock TO crl_app")
    server.sql("GRANT ALL ON ALL TABLES IN SCHEMA redlock TO crl_app")
    ok = Redlock([url], node_timeout=1.0)
    ok.release(ok.acquire(NAME, ttl=5))
    server.sql("DROP OWNED BY crl_app")
    server.sql("DROP ROLE crl_app")
