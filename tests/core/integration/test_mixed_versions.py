"""A worker of the previous release and one of this release on the same nodes.

During a rolling deploy both run at once: they must exclude each other and
share one token sequence. The previous release's package is taken from the
repository's history (``git archive``) and run in processes of its own beside
processes of this tree, all in :func:`~tests.support.recorded_grants.grant_loop`:
the recorder's list is the grant order across both versions.

On PostgreSQL the node starts as the previous release leaves it (its
functions, at revision 0): the previous release's workers are at work before
this release's first process brings the functions up in place (docs
``postgres.rst``, "Upgrades in place"), and they go on with the new bodies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator

import pytest

from celery_redlock.core.nodes.postgres.schema import REVISION
from tests.support.fencing_history import assert_strictly_increasing
from tests.support.healthy import HEALTHY_NODE_TIMEOUT
from tests.support.polling import wait_for

pytestmark = pytest.mark.integration

#: The previous release (its tag's commit).
PREVIOUS = "e66c69f"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
NAME = "mixed"
#: Grants before the run stops, once every process held the lock.
TARGET = 120
#: Grants of the previous release alone before this release's processes start.
ALONE = 15
#: A cap for a broken run only: the run ends on its events, long before.
SECONDS = 240.0

LOOP = """
import sys
import celery_redlock
from tests.support.recorded_grants import grant_loop
assert celery_redlock.__file__.startswith(sys.argv[1]), celery_redlock.__file__
urls, recorder, name, target, processes, seconds, timeout = sys.argv[2:9]
grant_loop(
    urls.split(","), recorder, name, int(target), float(seconds), hold=0.0005,
    node_timeout=float(timeout), acquire_timeout=1.0, processes=int(processes),
)
"""


@pytest.fixture(scope="module")
def previous() -> Iterator[str]:
    """A directory holding the previous release's ``celery_redlock`` package."""
    with tempfile.TemporaryDirectory(prefix="crl-previous-") as tree:
        archive = os.path.join(tree, "previous.tar")
        try:
            subprocess.run(
                ["git", "-C", ROOT, "archive", "-o", archive, PREVIOUS, "celery_redlock"],
                check=True,
                capture_output=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            why = getattr(exc, "stderr", b"") or str(exc).encode()
            pytest.skip(f"no history to take release {PREVIOUS} from: {why.decode().strip()}")
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        yield tree


@pytest.fixture
def recorder(redis_node_factory):
    """A redis-server outside the quorum, where critical sections leave their trace."""
    return redis_node_factory(1)[0]


def worker(tree: str, urls, recorder_url: str, processes: int) -> subprocess.Popen:
    """A process running the grant loop with the package of ``tree`` first on its path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys([tree, ROOT])))
    args = [",".join(urls), recorder_url, NAME, TARGET, processes, SECONDS, HEALTHY_NODE_TIMEOUT]
    return subprocess.Popen(
        [sys.executable, "-c", LOOP, tree, *map(str, args)],
        cwd=tree,  # "-c" puts the working directory first on the path
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def contend(previous: str, urls, recorder, before_new=None) -> None:
    """Two processes of each release on ``urls``: the previous release's first, until
    they granted :data:`ALONE` times; then ``before_new()``, and this release's two."""
    old = [worker(previous, urls, recorder.url, 4) for _ in range(2)]
    procs = list(old)
    try:
        with recorder.client() as rec:
            wait_for(lambda: rec.llen("tokens") >= ALONE or any(p.poll() for p in old), 120)
            assert all(p.poll() is None for p in old), [p.communicate()[1] for p in old]
            if before_new is not None:
                before_new()
            new = [worker(ROOT, urls, recorder.url, 4) for _ in range(2)]
            procs += new
        failed = [(p.args[3], p.communicate()[1]) for p in procs if p.wait() != 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not failed, failed
    with recorder.client() as rec:
        tokens = [int(t) for t in rec.lrange("tokens", 0, -1)]
        pids = [w.split(":")[0] for w in rec.lrange("who", 0, -1)]
        overlaps = int(rec.get("overlaps") or 0)
        assert rec.get("quorum_errors") is None  # every node is healthy here
    assert overlaps == 0, f"{overlaps} overlapping critical sections in {len(tokens)} grants"
    # every process held the lock, the previous release's after this one's began too
    assert {str(p.pid) for p in procs} <= set(pids), "every process must have held the lock"
    new_pids = {str(p.pid) for p in procs[len(old) :]}
    started = next(i for i, pid in enumerate(pids) if pid in new_pids)
    assert {str(p.pid) for p in old} & set(pids[started:]), "the previous release held it since"
    assert_strictly_increasing(tokens)


def revision(server) -> int:
    """The revision of the functions on a PostgreSQL node (0: a schema without the
    column, as a release before it makes on an empty server)."""
    column = server.sql(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = 'redlock' "
        "AND table_name = 'meta' AND column_name = 'revision'"
    )
    return server.sql("SELECT max(revision) FROM redlock.meta")[0][0] if column else 0


def test_the_previous_release_and_this_one_share_redis_masters(previous, redis_nodes3, recorder):
    contend(previous, redis_nodes3.urls, recorder)


def test_the_previous_release_and_this_one_share_a_postgres_node_upgraded_meanwhile(
    previous, postgres_node1, recorder
):
    server = postgres_node1[0]
    script = "from celery_redlock.core.nodes.postgres.schema import ddl; print(ddl())"
    env = dict(os.environ, PYTHONPATH=previous)
    sql = subprocess.run(
        [sys.executable, "-c", script],
        cwd=previous,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    server.sql(sql)  # the node as the previous release leaves it
    assert revision(server) == 0

    def not_upgraded_yet() -> None:
        assert revision(server) == 0

    contend(previous, postgres_node1.urls, recorder, not_upgraded_yet)
    assert revision(server) == REVISION  # brought up in place while the previous release ran
