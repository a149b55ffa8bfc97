"""The dashboard's JSON API and its guards, over real lock nodes (no browser): three
Redis masters, three Redis Clusters, three PostgreSQL databases, three etcd clusters.

The browser tests are in test_web_browser.py.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_redlock import LockedTask, Redlock
from celery_redlock.testing import RedisCluster, RedisClusters, RedisNodes
from celery_redlock.web import make_app, server
from tests.support.kinds import NODE_SETS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PREFIX = "crl-web"
TOKEN = "s3cret-token-for-tests"


#: The kinds whose servers the session starts: emptied here, not stopped.
SESSION_SERVERS = {
    "3postgres": "postgres_servers_session",
    "3etcd": "etcd_nodes3_session",
    "3zookeeper": "zookeeper_nodes3_session",
}


@pytest.fixture(scope="module", params=[s.id for s in NODE_SETS if s.count == 3 and not s.local])
def nodes(request) -> Iterator[Any]:
    """Three plain masters, the session's three Redis Clusters of three masters
    (a row per shard), its three PostgreSQL servers, or its three one-member etcd
    clusters, emptied before and after."""
    if request.param in SESSION_SERVERS:
        servers = request.getfixturevalue(SESSION_SERVERS[request.param])
        servers.flushall()
        yield servers
        servers.heal()
        servers.flushall()
        return
    if request.param == "3clusters":
        clusters: RedisClusters = request.getfixturevalue("redis_clusters_session")
        clusters.flushall()
        yield clusters
        clusters.flushall()
        return
    with RedisNodes(3) as started:
        yield started


def node_timeout(nodes: Any) -> float:
    """A PostgreSQL node's call is a commit, an etcd node's a raft commit: 3x the
    500 ms their pages advise (a loaded host's healthy node took longer, and no
    test here is about the timeout; a node down refuses at once); Redis's default."""
    return 1.5 if is_postgres(nodes) or is_etcd(nodes) else 0.05


def is_postgres(nodes: Any) -> bool:
    return nodes.urls[0].startswith("postgresql://")


def is_etcd(nodes: Any) -> bool:
    """etcd's nodes, or ZooKeeper's (kinds of read-and-commit alike: their keys are
    written through the kind, and a page costs a request per key)."""
    return nodes.urls[0].startswith(("etcd://", "zookeeper://"))


@pytest.fixture
def celery_app(nodes: Any) -> Celery:
    app = Celery("web-api", set_as_current=False)
    app.conf.update(
        redlock_nodes=nodes.urls,
        redlock_key_prefix=PREFIX,
        redlock_node_timeout=node_timeout(nodes),
    )

    @app.task(base=LockedTask, shared=False, name="web.settle", lock_on=("account",))
    def settle(account: int) -> None:
        pass

    return app


@pytest.fixture
def redlock(nodes: Any) -> Iterator[Redlock]:
    client = Redlock(nodes.urls, key_prefix=PREFIX, node_timeout=node_timeout(nodes))
    yield client
    if is_postgres(nodes) or is_etcd(nodes):
        nodes.flushall()
        client.close()
        return
    for node in nodes:
        with node.client() as c:  # in one pipeline: a test leaves 10,000 keys a node
            pipe = c.pipeline(transaction=False)
            for key in c.scan_iter(f"{PREFIX}:*", count=1000):
                pipe.delete(key)
            pipe.execute()
    client.close()


class Served:
    def __init__(self, app: Any):
        self.app = app
        self.httpd = server(app, "127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def call(self, path: str, body: Any = None, headers: dict | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, headers=headers or {})
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.app.close()


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[Served] = []

    def start(app: Any) -> Served:
        started.append(Served(app))
        return started[-1]

    yield start
    for s in started:
        s.close()


def test_the_state_shows_a_queue(celery_app, redlock, serve):
    """A queued key's row: how many calls wait, the next one, how long it has waited."""
    call = json.dumps({"sig": {}, "at": time.time() - 5})
    for id in ("task-q1", "task-q2"):
        redlock.park("web.settle:{jkl}", id, call, most=0, retention=60)
    site = serve(make_app(celery_app))
    status, state = site.call("/api/state")
    assert status == 200, state
    (row,) = state["groups"][0]["families"]["queue"]["rows"]
    assert row["tasks"] == ["web.settle"] and row["digest"] == "jkl"
    assert row["waiting"] == 2 and row["next"] == "task-q1" and row["answered"] == 3
    assert 5 <= row["oldest_age"] < 60


def test_the_state_shows_a_held_lock_a_claim_and_a_throttle(celery_app, redlock, serve):
    lease = redlock.acquire("web.settle:{abc}", ttl=30)
    assert lease is not None
    redlock.claim_next("web.settle:{def}", "task-claimed", ttl=20)
    redlock.throttle("web.settle:{ghi}", "task-throttled", period=10, trailing=True, ttl=20)
    site = serve(make_app(celery_app))
    status, state = site.call("/api/state")
    assert status == 200, state
    group = state["groups"][0]
    assert group["error"] is None and group["answered"] == 3
    assert group["nodes"] and all(n["up"] for n in group["nodes"])  # a row per node or shard
    (lock,) = group["families"]["lock"]["rows"]
    assert lock["tasks"] == ["web.settle"] and lock["digest"] == "abc"
    assert lock["owner"] == lease.owner and lock["votes"] == 3 and 25 < lock["remaining"] <= 30
    assert lock["fence"] == str(lease.fencing_token)
    claims = {r["name"]: r for r in group["families"]["claim"]["rows"]}
    assert claims["web.settle:{def}"]["claimant"] == "task-claimed"
    assert claims["web.settle:{def}"]["state"] == "queued"
    (throttle,) = group["families"]["throttle"]["rows"]
    assert throttle["runs"] == "task-throttled" and throttle["votes"] == 3
    # Filter by task: another task name shows nothing.
    status, other = site.call("/api/state?task=no.such.task")
    assert other["groups"][0]["families"]["lock"]["rows"] == []
    redlock.release(lease)


def test_a_read_only_dashboard_refuses_every_post(celery_app, redlock, serve):
    lease = redlock.acquire("web.settle:{ro}", ttl=30)
    site = serve(make_app(celery_app))
    for path in ("/api/release", "/api/withdraw", "/api/anything"):
        status, _ = site.call(path, {"name": "web.settle:{ro}", "owner": lease.owner})
        assert status in (403, 404), path
    status, body = site.call("/api/release", {"name": "web.settle:{ro}", "owner": lease.owner})
    assert status == 403 and "read-only" in body["error"]
    assert redlock.holder("web.settle:{ro}").owner == lease.owner  # never changed
    assert site.call("/api/session")[1]["actions"] is False
    redlock.release(lease)


def test_actions_need_authentication():
    with pytest.raises(Exception, match="authentication"):
        make_app(Celery(set_as_current=False), actions=True)


def test_an_action_needs_login_csrf_and_the_same_origin(celery_app, redlock, serve):
    lease = redlock.acquire("web.settle:{act}", ttl=30)
    site = serve(make_app(celery_app, actions=True, auth=TOKEN))
    body = {"name": "web.settle:{act}", "owner": lease.owner, "permit": 0}
    assert site.call("/api/state")[0] == 401
    assert site.call("/api/release", body)[0] == 401  # not logged in
    origin = {"Origin": site.base}
    assert site.call("/api/login", {"token": "wrong-token!"}, origin)[0] == 401
    request = urllib.request.Request(
        site.base + "/api/login",
        data=json.dumps({"token": TOKEN}).encode(),
        headers={"Content-Type": "application/json", **origin},
    )
    with urllib.request.urlopen(request) as response:
        csrf = json.loads(response.read())["csrf"]
        cookie = response.headers["Set-Cookie"].split(";", 1)[0]
    session = {"Cookie": cookie}
    assert site.call("/api/state", headers=session)[0] == 200
    assert site.call("/api/release", body, {**session, **origin})[0] == 403  # no CSRF token
    forged = {**session, "X-CSRF-Token": csrf, "Origin": "http://evil.example"}
    assert site.call("/api/release", body, forged)[0] == 403  # another origin
    assert redlock.holder("web.settle:{act}").owner == lease.owner
    wrong_owner = dict(body, owner=lease.owner + "x")
    good = {**session, **origin, "X-CSRF-Token": csrf}
    status, refused = site.call("/api/release", wrong_owner, good)
    assert status == 409 and "no longer held" in refused["error"]
    status, done = site.call("/api/release", body, good)
    assert status == 200 and done["deleted"] == 3, done
    assert redlock.holder("web.settle:{act}").owner is None
    # A bearer token works for scripts, without a session.
    redlock.claim_next("web.settle:{cl}", "queued-task", ttl=20)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    status, done = site.call(
        "/api/withdraw", {"name": "web.settle:{cl}", "claimant": "queued-task"}, bearer
    )
    assert status == 200 and done["deleted"] == 3
    assert redlock.claimant("web.settle:{cl}").claimant is None


def test_a_holder_that_is_not_renewed_turns_suspect(celery_app, redlock, serve):
    lease = redlock.acquire("web.settle:{stale}", ttl=5)  # nobody renews it
    app = make_app(celery_app)
    app.board.watch.grace = 0.5
    site = serve(app)
    seen = []
    deadline = time.monotonic() + 4.5
    while time.monotonic() < deadline:
        (row,) = site.call("/api/state")[1]["groups"][0]["families"]["lock"]["rows"]
        seen.append((row["remaining"], row["suspect"]))
        if row["suspect"]:
            break
        time.sleep(0.2)
    assert seen[-1][1], seen  # suspect while the key still exists
    assert not seen[0][1]
    assert seen[-1][0] < seen[0][0]
    redlock.release(lease)


def take_down(node: Any) -> None:
    """A lock node down: a plain master, a PostgreSQL server or an etcd cluster stopped,
    every server of a Redis Cluster paused."""
    if isinstance(node, RedisCluster):
        for server in node.servers:
            server.pause()
    else:
        node.stop()


def bring_back(node: Any) -> None:
    if isinstance(node, RedisCluster):
        for server in node.servers:
            server.resume()
    else:
        node.start()


def test_a_node_down_is_shown_and_the_state_still_answers(celery_app, nodes, redlock, serve):
    lease = redlock.acquire("web.settle:{down}", ttl=30)
    site = serve(make_app(celery_app))
    assert site.call("/api/state")[1]["groups"][0]["answered"] == 3  # its connections open
    take_down(nodes[2])
    try:
        status, state = site.call("/api/state")
        group = state["groups"][0]
        # a row per node, or per shard of a cluster ("<url> shard <host:port>")
        rows = [(n["node"].split(" shard ")[0], n["up"]) for n in group["nodes"]]
        assert status == 200 and {url for url, _ in rows} == set(nodes.urls)
        assert all(up == (url != nodes.urls[2]) for url, up in rows), rows
        assert group["error"] is None and group["answered"] == 2
        (row,) = group["families"]["lock"]["rows"]
        assert row["owner"] == lease.owner and row["votes"] == 2
        take_down(nodes[1])
        status, state = site.call("/api/state")
        group = state["groups"][0]
        assert status == 200 and "only 1 of 3 lock nodes answered" in group["error"]
    finally:
        bring_back(nodes[1])
        bring_back(nodes[2])
    redlock.release(lease)


def test_ten_thousand_keys_one_scan_page_per_family_per_node(celery_app, nodes, redlock, serve):
    """The first read and each refresh stay fast; SCAN calls per refresh are bounded."""
    families = 8  # lock, permit, claim, queue, burst, throttle, rate, beat
    if is_postgres(nodes) or is_etcd(nodes):
        ten_thousand_keys_paged_on(celery_app, nodes, redlock, serve, families)
        return
    for node in nodes:
        with node.client() as c:
            pipe = c.pipeline(transaction=False)
            for i in range(10_000):
                key = f"{PREFIX}:lock:web.settle:{{{i:032x}}}"
                pipe.set(key, f"task-{i}|0|host|{i}|abcdef", px=120_000)
            pipe.execute()
    site = serve(make_app(celery_app))

    # the servers SCAN reaches: each node, or each shard master of a cluster
    servers = [s for node in nodes for s in getattr(node, "masters", [node])]

    def calls() -> tuple[int, int]:
        """SCAN calls, and commands of any kind but INFO, on every server so far."""
        scan = other = 0
        for one in servers:
            with one.client() as c:
                for name, stat in c.info("commandstats").items():
                    if name == "cmdstat_scan":
                        scan += stat["calls"]
                    elif not name.startswith("cmdstat_info"):
                        other += stat["calls"]
        return scan, other

    timings, cursor = [], None
    for refresh in range(5):
        scans, others = calls()
        query = "" if cursor is None else f"?cursor.0.lock={cursor}"
        started = time.perf_counter()
        status, state = site.call("/api/state" + query)
        timings.append(time.perf_counter() - started)
        assert status == 200
        scans_after, others_after = calls()
        assert scans_after - scans <= families * len(servers)
        assert state["scan_calls"] <= families * len(servers)
        lock = state["groups"][0]["families"]["lock"]
        assert lock["rows"] and lock["next"], lock["cursor"]
        assert len(lock["rows"]) < 10_000 // 2
        # each row of the page read on each node (one script: a few commands), and
        # little more: the work follows the page, not the 10,000 keys held
        assert others_after - others <= 5 * len(lock["rows"]) * len(nodes) + 100
        cursor = lock["next"] if refresh % 2 else cursor  # stay, then page on
    print(f"\n/api/state over 10,000 held keys: {', '.join(f'{t:.3f}' for t in timings)} s")


def ten_thousand_keys_paged_on(
    celery_app: Celery, nodes: Any, redlock: Redlock, serve: Any, families: int
) -> None:
    """The PostgreSQL and etcd nodes' share of the test above (no command stats to
    read): each refresh sends one SCAN per family per node (the pager's count) and
    pages on through 10,000 held keys."""
    names = [f"{PREFIX}:lock:web.settle:{{{i:032x}}}" for i in range(10_000)]
    if is_etcd(nodes):
        for node in nodes:
            with node.client() as keys:
                # ten minutes: a loaded host's pass over a ZooKeeper ensemble took two
                keys.set_many(
                    {n: f"task-{i}|0|host|{i}|abcdef" for i, n in enumerate(names)}, 600_000
                )
    else:
        assert redlock.holder("web.settle:{none}").owner is None  # the schema is there
        for node in nodes:
            node.sql(
                "INSERT INTO redlock.kv (key, kind, val, expires_at) SELECT "
                "%s || ':lock:web.settle:{' || lpad(to_hex(i), 32, '0') || '}', 's', "
                "'task-' || i || '|0|host|' || i || '|abcdef', "
                "clock_timestamp() + interval '120 s' FROM generate_series(0, 9999) i",
                PREFIX,
            )
    # an etcd node reads a page's rows one call each, 10-12 s for the default
    # 1,000 on a quiet 2-core host: a quarter of that keeps a loaded host's
    # refresh well inside the client's timeout, and pages on alike
    site = serve(make_app(celery_app, scan_count=250 if is_etcd(nodes) else 1000))
    cursor, whole, timings = None, 0, []
    # Four refreshes on which every node answered; a node that missed its timeout on
    # a loaded host keeps its cursor for the next refresh (the pager's rule), so it
    # may take a few more (sixteen refreshes of 1,000 keys end no node's pass; a
    # ZooKeeper ensemble reads a page's rows one call each, slow on a busy host).
    for _ in range(16):
        query = "" if cursor is None else f"?cursor.0.lock={cursor}"
        started = time.perf_counter()
        status, state = site.call("/api/state" + query)
        timings.append(time.perf_counter() - started)
        assert status == 200
        assert state["scan_calls"] <= families * len(nodes)
        group = state["groups"][0]
        lock = group["families"]["lock"]
        if not group["answered"]:  # no node in time on a loaded host: the next goes on
            continue
        assert lock["rows"] and lock["next"], (lock["cursor"], group["answered"])
        assert len(lock["rows"]) < 10_000 // 2
        # each node that answered read its next page: its cursor moved on
        moved = sum(a != b for a, b in zip(lock["cursor"].split(","), lock["next"].split(",")))
        assert moved >= group["answered"], (lock["cursor"], lock["next"], group["answered"])
        whole += group["answered"] == len(nodes)
        cursor = lock["next"]
        if whole == 4:
            break
    assert whole == 4, f"every node answered on {whole} of {len(timings)} refreshes"
    print(f"\n/api/state over 10,000 held keys: {', '.join(f'{t:.3f}' for t in timings)} s")
