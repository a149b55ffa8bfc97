"""The pytest side of :mod:`celery_redlock.testing`: its fixtures, and the hooks the
first node fixture of a session registers (never at import)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from .cluster import RedisCluster, RedisClusters
from .nodes import RedisNodes, close_all, free_port, resume_paused

__all__ = [
    "etcd_cluster3",
    "etcd_node1",
    "etcd_nodes3",
    "etcd_nodes3_session",
    "etcd_servers_session",
    "free_port_fixture",
    "memory_nodes3",
    "postgres_node1",
    "postgres_nodes3",
    "postgres_servers_session",
    "redis_cluster_factory",
    "redis_clusters3",
    "redis_clusters_session",
    "redis_node_factory",
    "redis_nodes3",
    "redis_nodes5",
    "redis_nodes_session",
    "zookeeper_ensemble3",
    "zookeeper_node1",
    "zookeeper_nodes3",
    "zookeeper_nodes3_session",
    "zookeeper_servers_session",
]


class _SessionGuard:
    """The hooks of a session in which one of the node fixtures ran.

    It is registered by that fixture (:func:`_guard`), never at import: after each
    test's teardown it resumes the servers left paused, and at the end of the
    session it stops every server this package started.
    """

    NAME = "celery-redlock-nodes"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        try:
            return (yield)
        finally:
            resume_paused()

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        close_all()
        for kind in ("postgres", "etcd", "zookeeper"):
            module = f"celery_redlock.testing.{kind}"
            if module in sys.modules:
                sys.modules[module].close_all()


def _guard(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(_SessionGuard.NAME):
        config.pluginmanager.register(_SessionGuard(), _SessionGuard.NAME)


@pytest.fixture(name="free_port")
def free_port_fixture() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_port()


def _closed_after(config: pytest.Config, build: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """A factory fixture's body: ``build`` what the test asks for, close it all after."""
    _guard(config)
    made: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Any:
        made.append(build(*args, **kwargs))
        return made[-1]

    yield make
    for servers in made:
        servers.close()


@pytest.fixture
def redis_node_factory(pytestconfig: pytest.Config) -> Iterator[Callable[..., RedisNodes]]:
    """``make(n=3, extra_args=())`` starts private nodes, closed after the test."""

    def build(n: int = 3, extra_args: Sequence[str] = ()) -> RedisNodes:
        return RedisNodes(n, extra_args=extra_args)

    yield from _closed_after(pytestconfig, build)


@pytest.fixture(scope="session")
def redis_nodes_session(pytestconfig: pytest.Config) -> Iterator[RedisNodes]:
    """The shared pool of 5 nodes, started once per session."""
    _guard(pytestconfig)
    with RedisNodes(5) as nodes:
        yield nodes


def _healthy_view(pool: RedisNodes, n: int) -> Iterator[RedisNodes]:
    view = RedisNodes(nodes=pool.nodes[:n])
    pool.heal()
    pool.flushall()
    yield view
    pool.heal()  # the next test gets a working pool even if this one broke it


@pytest.fixture
def redis_nodes3(redis_nodes_session: RedisNodes) -> Iterator[RedisNodes]:
    """3 nodes of the session pool, empty; healed after the test."""
    yield from _healthy_view(redis_nodes_session, 3)


@pytest.fixture
def redis_nodes5(redis_nodes_session: RedisNodes) -> Iterator[RedisNodes]:
    """The 5 nodes of the session pool, empty; healed after the test."""
    yield from _healthy_view(redis_nodes_session, 5)


@pytest.fixture
def redis_cluster_factory(pytestconfig: pytest.Config) -> Iterator[Callable[..., RedisCluster]]:
    """``make(masters=3, replicas=0)`` forms a private Redis Cluster, closed after the test."""

    def build(masters: int = 3, replicas: int = 0) -> RedisCluster:
        return RedisCluster(masters, replicas)

    yield from _closed_after(pytestconfig, build)


@pytest.fixture(scope="session")
def redis_clusters_session(pytestconfig: pytest.Config) -> Iterator[RedisClusters]:
    """Three Redis Clusters of three masters each, formed once per session."""
    _guard(pytestconfig)
    with RedisClusters(3, masters=3) as clusters:
        yield clusters


@pytest.fixture
def redis_clusters3(redis_clusters_session: RedisClusters) -> Iterator[RedisClusters]:
    """The three session clusters (three lock nodes), empty."""
    redis_clusters_session.flushall()
    yield redis_clusters_session


def _postgres_or_skip() -> None:
    """Skip a PostgreSQL fixture where no server can be started; under
    ``CI=true`` that is a failure instead (a missing install step)."""
    from .postgres import postgres_missing

    why = postgres_missing()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(why + "; CI=true requires it")
    pytest.skip(why)


@pytest.fixture(scope="session")
def postgres_servers_session(pytestconfig: pytest.Config) -> Iterator[Any]:
    """Three PostgreSQL servers, started once per session (each one lock node)."""
    _postgres_or_skip()
    from .postgres import PostgresServers

    _guard(pytestconfig)
    with PostgresServers(3) as servers:
        yield servers


def _postgres_view(pool: Any, n: int) -> Iterator[Any]:
    from .postgres import PostgresServers

    pool.heal()
    pool.flushall()
    yield PostgresServers(servers=pool.servers[:n])
    pool.heal()  # the next test gets working servers even if this one broke them


@pytest.fixture
def postgres_nodes3(postgres_servers_session: Any) -> Iterator[Any]:
    """Three PostgreSQL servers of the session, three lock nodes, empty; healed after."""
    yield from _postgres_view(postgres_servers_session, 3)


@pytest.fixture
def postgres_node1(postgres_servers_session: Any) -> Iterator[Any]:
    """One PostgreSQL server of the session, one lock node alone, empty; healed after."""
    yield from _postgres_view(postgres_servers_session, 1)


def _etcd_or_skip() -> None:
    """Skip an etcd fixture where no etcd can be started; under ``CI=true`` that
    is a failure instead (a missing install step)."""
    from .etcd import etcd_missing

    _skip(etcd_missing())


def _skip(why: str | None) -> None:
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(why + "; CI=true requires it")
    pytest.skip(why)


@pytest.fixture(scope="session")
def etcd_servers_session(pytestconfig: pytest.Config) -> Iterator[Any]:
    """One single-member etcd cluster, started once per session (one lock node)."""
    _etcd_or_skip()
    from .etcd import EtcdClusters

    _guard(pytestconfig)
    with EtcdClusters(1, size=1) as clusters:
        yield clusters


@pytest.fixture
def etcd_node1(etcd_servers_session: Any) -> Iterator[Any]:
    """The session's etcd cluster of one member, one lock node alone, empty; healed after."""
    etcd_servers_session.heal()
    etcd_servers_session.flushall()
    yield etcd_servers_session
    etcd_servers_session.heal()


@pytest.fixture
def etcd_cluster3(pytestconfig: pytest.Config) -> Iterator[Any]:
    """A fresh etcd cluster of three members (one lock node), for the fault tests
    that kill, pause and restart its members; stopped after the test."""
    _etcd_or_skip()
    from .etcd import EtcdCluster

    _guard(pytestconfig)
    with EtcdCluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def etcd_nodes3_session(pytestconfig: pytest.Config) -> Iterator[Any]:
    """Three independent single-member etcd clusters, started once per session
    (three lock nodes)."""
    _etcd_or_skip()
    from .etcd import EtcdClusters

    _guard(pytestconfig)
    with EtcdClusters(3, size=1) as clusters:
        yield clusters


@pytest.fixture
def etcd_nodes3(etcd_nodes3_session: Any) -> Iterator[Any]:
    """The session's three etcd clusters (three lock nodes), empty; healed after."""
    etcd_nodes3_session.heal()
    etcd_nodes3_session.flushall()
    yield etcd_nodes3_session
    etcd_nodes3_session.heal()


@pytest.fixture
def memory_nodes3() -> Iterator[Any]:
    """Three memory nodes of this process (``memory://``, three lock nodes), of
    fresh names: empty, no server to start; with the fleets' verbs
    (:class:`celery_redlock.testing.memory.MemoryNodes`)."""
    from .memory import MemoryNodes

    with MemoryNodes(3) as nodes:
        yield nodes


def _zookeeper_or_skip() -> None:
    """Skip a ZooKeeper fixture where no ensemble can be started (fail under ``CI=true``)."""
    from .zookeeper import zookeeper_missing

    _skip(zookeeper_missing())


@pytest.fixture(scope="session")
def zookeeper_servers_session(pytestconfig: pytest.Config) -> Iterator[Any]:
    """One ZooKeeper ensemble of three members, started once per session (one lock node)."""
    _zookeeper_or_skip()
    from .zookeeper import ZookeeperEnsembles

    _guard(pytestconfig)
    with ZookeeperEnsembles(1, size=3) as ensembles:
        yield ensembles


@pytest.fixture
def zookeeper_node1(zookeeper_servers_session: Any) -> Iterator[Any]:
    """The session's ensemble of three members, one lock node alone, empty; healed after."""
    zookeeper_servers_session.heal()
    zookeeper_servers_session.flushall()
    yield zookeeper_servers_session
    zookeeper_servers_session.heal()


@pytest.fixture
def zookeeper_ensemble3(pytestconfig: pytest.Config) -> Iterator[Any]:
    """A fresh ZooKeeper ensemble of three members (one lock node), for the fault
    tests that kill, pause and restart its members; stopped after the test."""
    _zookeeper_or_skip()
    from .zookeeper import ZookeeperEnsemble

    _guard(pytestconfig)
    with ZookeeperEnsemble(3) as ensemble:
        yield ensemble


@pytest.fixture(scope="session")
def zookeeper_nodes3_session(pytestconfig: pytest.Config) -> Iterator[Any]:
    """Three independent single-member ensembles, started once per session (three lock nodes)."""
    _zookeeper_or_skip()
    from .zookeeper import ZookeeperEnsembles

    _guard(pytestconfig)
    with ZookeeperEnsembles(3, size=1) as ensembles:
        yield ensembles


@pytest.fixture
def zookeeper_nodes3(zookeeper_nodes3_session: Any) -> Iterator[Any]:
    """The session's three single-member ensembles (three lock nodes), empty; healed after."""
    zookeeper_nodes3_session.heal()
    zookeeper_nodes3_session.flushall()
    yield zookeeper_nodes3_session
    zookeeper_nodes3_session.heal()
