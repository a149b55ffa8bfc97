"""The pytest side of :mod:`celery_redlock.testing`: its fixtures, and the hooks the
first node fixture of a session registers (never at import)."""

from __future__ import annotations

import importlib
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


def _started(config: pytest.Config, kind: str | None, build: Callable[[], Any]) -> Iterator[Any]:
    """A session fixture's body: skip where no ``kind`` server can start, else
    ``build`` the servers once and close them at the end."""
    if kind is not None:
        module = importlib.import_module(f"{__package__}.{kind}")
        _skip(getattr(module, f"{kind}_missing")())
    _guard(config)
    with build() as servers:
        yield servers


def _healed(pool: Any, view: Any = None) -> Iterator[Any]:
    """A test's ``view`` of the session ``pool`` (all of it by default): healed and
    empty, and healed after, so that the next test gets working servers even if
    this one broke them."""
    pool.heal()
    pool.flushall()
    yield pool if view is None else view
    pool.heal()


def _skip(why: str | None) -> None:
    """Skip where a fixture's servers cannot start; under ``CI=true`` that is a
    failure instead (a missing install step)."""
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(why + "; CI=true requires it")
    pytest.skip(why)


@pytest.fixture(scope="session")
def redis_nodes_session(pytestconfig: pytest.Config) -> Iterator[RedisNodes]:
    """The shared pool of 5 nodes, started once per session."""
    yield from _started(pytestconfig, None, lambda: RedisNodes(5))


@pytest.fixture
def redis_nodes3(redis_nodes_session: RedisNodes) -> Iterator[RedisNodes]:
    """3 nodes of the session pool, empty; healed after the test."""
    yield from _healed(redis_nodes_session, RedisNodes(nodes=redis_nodes_session.nodes[:3]))


@pytest.fixture
def redis_nodes5(redis_nodes_session: RedisNodes) -> Iterator[RedisNodes]:
    """The 5 nodes of the session pool, empty; healed after the test."""
    yield from _healed(redis_nodes_session, RedisNodes(nodes=redis_nodes_session.nodes[:5]))


@pytest.fixture
def redis_cluster_factory(pytestconfig: pytest.Config) -> Iterator[Callable[..., RedisCluster]]:
    """``make(masters=3, replicas=0)`` forms a private Redis Cluster, closed after the test."""

    def build(masters: int = 3, replicas: int = 0) -> RedisCluster:
        return RedisCluster(masters, replicas)

    yield from _closed_after(pytestconfig, build)


@pytest.fixture(scope="session")
def redis_clusters_session(pytestconfig: pytest.Config) -> Iterator[RedisClusters]:
    """Three Redis Clusters of three masters each, formed once per session."""
    yield from _started(pytestconfig, None, lambda: RedisClusters(3, masters=3))


@pytest.fixture
def redis_clusters3(redis_clusters_session: RedisClusters) -> Iterator[RedisClusters]:
    """The three session clusters (three lock nodes), empty."""
    redis_clusters_session.flushall()
    yield redis_clusters_session


def _postgres(n: int = 3) -> Any:
    from .postgres import PostgresServers

    return PostgresServers(n)


@pytest.fixture(scope="session")
def postgres_servers_session(pytestconfig: pytest.Config) -> Iterator[Any]:
    """Three PostgreSQL servers, started once per session (each one lock node)."""
    yield from _started(pytestconfig, "postgres", _postgres)


@pytest.fixture
def postgres_nodes3(postgres_servers_session: Any) -> Iterator[Any]:
    """Three PostgreSQL servers of the session, three lock nodes, empty; healed after."""
    pool = postgres_servers_session
    yield from _healed(pool, type(pool)(servers=pool.servers[:3]))


@pytest.fixture
def postgres_node1(postgres_servers_session: Any) -> Iterator[Any]:
    """One PostgreSQL server of the session, one lock node alone, empty; healed after."""
    pool = postgres_servers_session
    yield from _healed(pool, type(pool)(servers=pool.servers[:1]))


#: Per ensemble kind: its one ensemble, its fleet of ensembles.
_ENSEMBLES = {
    "etcd": ("EtcdCluster", "EtcdClusters"),
    "zookeeper": ("ZookeeperEnsemble", "ZookeeperEnsembles"),
}


def _ensembles(kind: str, n: int, size: int, doc: str, name: str) -> Any:
    """A fixture that starts ``n`` ensembles of ``kind``, ``size`` members each
    (``n=0``: one ensemble alone), skipped where ``kind`` cannot start: of the
    session where ``n``, else of one test, for the fault tests that kill, pause
    and restart its members."""

    def build() -> Any:
        one, many = _ENSEMBLES[kind]
        module = importlib.import_module(f"{__package__}.{kind}")
        return getattr(module, many)(n, size=size) if n else getattr(module, one)(size)

    def fixture(pytestconfig: pytest.Config) -> Iterator[Any]:
        yield from _started(pytestconfig, kind, build)

    fixture.__doc__ = doc
    return pytest.fixture(fixture, scope="session" if n else "function", name=name)


def _view(session: str, doc: str, name: str) -> Any:
    """A fixture that gives a test the fleet of the session fixture ``session``,
    healed and empty, and heals it after."""

    def fixture(request: pytest.FixtureRequest) -> Iterator[Any]:
        yield from _healed(request.getfixturevalue(session))

    fixture.__doc__ = doc
    return pytest.fixture(fixture, name=name)


def _kind(kind: str, label: str, one: str, shared_size: int) -> tuple[Any, ...]:
    """The five fixtures of an ensemble kind (``one``: what an ensemble is called
    there), whose shared one lock node has ``shared_size`` members."""
    members = "one member" if shared_size == 1 else "three members"
    return (
        _ensembles(
            kind, 1, shared_size,
            f"One {label} {one} of {members}, started once per session (one lock node).",
            f"{kind}_servers_session",
        ),
        _view(
            f"{kind}_servers_session",
            f"The session's {label} {one} of {members}, one lock node alone, empty; healed after.",
            f"{kind}_node1",
        ),
        _ensembles(
            kind, 0, 3,
            f"A fresh {label} {one} of three members (one lock node), for the fault tests "
            "that kill, pause and restart its members; stopped after the test.",
            f"{kind}_{one}3",
        ),
        _ensembles(
            kind, 3, 1,
            f"Three independent single-member {label} {one}s, started once per session "
            "(three lock nodes).",
            f"{kind}_nodes3_session",
        ),
        _view(
            f"{kind}_nodes3_session",
            f"The session's three single-member {label} {one}s (three lock nodes), empty; "
            "healed after.",
            f"{kind}_nodes3",
        ),
    )  # fmt: skip


etcd_servers_session, etcd_node1, etcd_cluster3, etcd_nodes3_session, etcd_nodes3 = _kind(
    "etcd", "etcd", "cluster", 1
)
(
    zookeeper_servers_session,
    zookeeper_node1,
    zookeeper_ensemble3,
    zookeeper_nodes3_session,
    zookeeper_nodes3,
) = _kind("zookeeper", "ZooKeeper", "ensemble", 3)


@pytest.fixture
def memory_nodes3() -> Iterator[Any]:
    """Three memory nodes of this process (``memory://``, three lock nodes), of
    fresh names: empty, no server to start; with the fleets' verbs
    (:class:`celery_redlock.testing.memory.MemoryNodes`)."""
    from .memory import MemoryNodes

    with MemoryNodes(3) as nodes:
        yield nodes
