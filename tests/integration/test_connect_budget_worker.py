"""A real prefork worker whose lock nodes are slow to connect to, as on a busy
host: each new connection's handshake takes several node timeouts (a proxy
holds its first reply), within the default connect timeout. Every pool child's
first lock is taken at the first attempt, and the log says no outage (it said
``lock nodes unavailable: 0 of 3 answered ... Timeout connecting ... within
0.05s`` when the node timeout bounded the connect too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_redlock.core.nodes import kind_timeouts
from tests.support import harness, lockapp, netproxy
from tests.support.harness import Topology

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: How long each new connection's first reply is held: six default node timeouts.
SLOW_START = 0.3


@pytest.fixture(scope="module")
def slow_nodes_worker(
    topology: Topology, tmp_path_factory, pytestconfig
) -> Iterator[tuple[harness.PreforkWorker, Celery, netproxy.ProxyGrid]]:
    node_timeout, connect_timeout = kind_timeouts("redis")  # the settings unset: Redis's own
    assert node_timeout < SLOW_START < connect_timeout / 2
    harness.WORKER_LOGS.register(pytestconfig)
    with netproxy.ProxyGrid(topology.quorum.urls, ["w"]) as grid:
        grid.set("w", range(3), netproxy.SLOW_START, delay=SLOW_START)
        env = dict(
            topology.env(11, 12),
            CRL_NODES=",".join(grid.urls("w", db=1)),  # db 1: a connect includes SELECT
            CRL_CONF=json.dumps({"task_default_queue": "slowconnect"}),
        )
        logdir = str(tmp_path_factory.mktemp("slowconnect"))
        proc = harness.PreforkWorker("slowconnect", env, logdir, ["slowconnect"], 2).start()
        app = lockapp.app_from_env(env, main="slowconnect-client")
        topology.apps.append(app)
        try:
            yield proc, app, grid
        finally:
            proc.stop(now=True)


def test_every_childs_first_lock_is_taken_despite_slow_connects(slow_nodes_worker):
    proc, app, grid = slow_nodes_worker
    run = harness.new_run()
    slow = app.tasks["lockapp.slow"]
    results = [slow.apply_async((f"k{i}", run), {"duration": 0.3}) for i in range(4)]
    for result in results:
        assert result.get(timeout=30)["token"] > 0
        assert result.state == "SUCCESS"
    with open(proc.logfile, errors="replace") as f:
        log = f.read()
    assert "lock nodes unavailable" not in log, log
    assert "Timeout connecting" not in log, log
    # Both pool children opened their connections through the slow proxies.
    assert all(proxy.accepted >= 2 for proxy in grid["w"]), [p.accepted for p in grid["w"]]
