"""``celery redlock ...`` against real redis-server nodes.

Most tests call the click group in process through ``CliRunner`` with the
``CLIContext`` Celery itself would build; two run ``python -m celery -A
tests.integration.cli_app redlock nodes`` in a subprocess to prove the
``celery.commands`` entry point and the exit codes through Celery's own main.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cli_app
import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_redlock import LockedTask, plan_of
from celery_redlock.cli import redlock
from celery_redlock.core import RateKey, parse_rate
from celery_redlock.core.nodes.postgres.schema import VERSION
from celery_redlock.redlock import Lease, make_owner, mask_url
from tests.support.deploy import primary_with_replicas
from tests.support.kinds import is_redis, needs_three

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def invoke(app: Any, *args: str, input: str | None = None) -> Result:
    """Run ``celery redlock ARGS`` on ``app``; a traceback fails the test."""
    result = CliRunner().invoke(
        redlock, list(args), obj=CLIContext(app=app, no_color=True, workdir=None), input=input
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def hold(app: Any, account_id: int, task_id: str, ttl: float = 60) -> Lease:
    """Take cli.settle's lock for ``account_id`` as task ``task_id``, as a worker would."""
    plan = plan_of(app.tasks[cli_app.SETTLE])
    lease = plan.redlock.acquire(
        plan.keys.build([account_id], {}), ttl=ttl, owner=make_owner(task_id, 0)
    )
    assert lease is not None
    return lease


@pytest.fixture
def app(redis_nodes3):
    return cli_app.make_app(redis_nodes3.urls)


# -- nodes ---------------------------------------------------------------------


@pytest.fixture
def any_app(nodes3):
    """The app on three plain masters, or on three Redis Clusters."""
    return cli_app.make_app(nodes3.urls)


def n_members(nodes: Any) -> int:
    """The members of the first ZooKeeper ensemble among ``nodes`` (hosts in its URL)."""
    return len(nodes.urls[0].split("://", 1)[1].split("/", 1)[0].split(","))


def test_nodes_all_up(any_app, nodes3):
    result = invoke(any_app, "nodes")
    assert result.exit_code == 0, result.output
    for url in nodes3.urls:
        assert url in result.output
    for cluster in getattr(nodes3, "clusters", ()):  # every shard master has a row
        for master in cluster.masters:
            assert f"{cluster.url} shard {master.host}:{master.port}" in result.output
    if is_redis(nodes3):
        assert "noeviction" in result.output
    elif nodes3.urls[0].startswith("etcd"):  # an etcd cluster: its version and members
        assert "etcd 3." in result.output and "cluster" in result.output
        # one member is one server: flagged as a single node is
        assert "members 1 (quorum 1) (UNSAFE)" in result.output
        assert f"WARNING {nodes3.urls[0]}: 1 member: the cluster is one server" in result.output
    elif nodes3.urls[0].startswith("memory"):  # a memory node: how many keys it keeps
        assert "memory, 0 keys" in result.output and "primary" in result.output
    elif nodes3.urls[0].startswith("zookeeper"):  # an ensemble: its version and members
        assert "zookeeper 3." in result.output and "ensemble" in result.output
    else:  # a PostgreSQL server: its version, that it is the primary, its durability
        assert "postgresql 1" in result.output and "primary" in result.output
        assert "synchronous_commit on, full_page_writes on" in result.output
    # the test servers of PostgreSQL run with fsync off, the etcd ones with one member,
    # and so do the three ZooKeeper ensembles (one ensemble has three)
    flagged = nodes3.urls[0].startswith(("postgres", "etcd")) or (
        nodes3.urls[0].startswith("zookeeper") and n_members(nodes3) < 2
    )
    assert ("UNSAFE" in result.output) == flagged
    assert "maxmemory" not in result.output or is_redis(nodes3)
    n = len(nodes3.urls)
    assert f"Quorum: reachable ({n} of {n} nodes answered, {n // 2 + 1} needed)" in result.output
    assert ("ONE node" in result.output) == (n == 1)


def test_nodes_says_that_the_brokers_redis_is_one_node(redis_node_factory):
    node = redis_node_factory(1)[0]
    app = cli_app.make_app([])
    app.conf.broker_url = node.url
    result = invoke(app, "nodes")
    assert result.exit_code == 0, result.output
    assert (
        f"lock node: {node.url} (the broker's Redis, as redlock_nodes is not set): ONE node"
        in result.output
    )


def test_help_is_plain_text():
    """Click shows docstrings as they are: no reStructuredText markup in them."""
    for command in ["--help"] + [f"{name} --help" for name in redlock.commands]:
        output = CliRunner().invoke(redlock, command.split()).output
        assert "`" not in output and ":class:" not in output, (command, output)


def test_nodes_majority_down_exits_2_and_names_them(app, redis_nodes3):
    redis_nodes3.kill(1)
    redis_nodes3.kill(2)
    result = invoke(app, "nodes")
    assert result.exit_code == 2, result.output
    assert "Quorum: UNREACHABLE (1 of 3 nodes answered, 2 needed)" in result.stdout
    for url in redis_nodes3.urls[1:]:
        assert url in result.stderr
    assert redis_nodes3.urls[0] not in result.stderr


def test_nodes_a_hung_node_costs_one_timeout(app, redis_nodes3):
    redis_nodes3.pause(0)
    started = time.monotonic()
    result = invoke(app, "nodes", "--timeout", "0.2")
    assert result.exit_code == 3, result.output  # down, yet a quorum answered
    assert time.monotonic() - started < 2
    assert f"DOWN    {redis_nodes3.urls[0]}" in result.output


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-lru"])
def test_nodes_flags_a_policy_that_evicts(redis_node_factory, policy):
    node = redis_node_factory(1, extra_args=["--maxmemory-policy", policy])[0]
    result = invoke(cli_app.make_app([node.url]), "nodes")
    assert result.exit_code == 0, result.output
    assert f"{policy} (UNSAFE)" in result.output
    assert f"WARNING {node.url}: maxmemory-policy {policy}" in result.output


def test_nodes_weighs_a_primarys_replicas_against_min_replicas():
    primary, replica = primary_with_replicas(1)
    try:
        out = {
            n: invoke(cli_app.make_app([primary.url], redlock_min_replicas=n), "nodes")
            for n in (0, 1, 2)
        }
    finally:
        replica.close()
        primary.close()
    assert all(result.exit_code == 0 for result in out.values()), out
    short = f"WARNING {primary.url}: 1 replica connected, redlock_min_replicas is 2"
    assert short in out[2].output
    assert f"note    {primary.url}: 1 replica and redlock_min_replicas 0" in out[0].output
    assert "redlock_min_replicas" not in out[1].output  # enough: nothing to say


def test_nodes_weighs_each_shards_replicas_against_min_replicas(redis_cluster_factory):
    cluster = redis_cluster_factory(3, replicas=1)
    out = {
        n: invoke(cli_app.make_app([cluster.url], redlock_min_replicas=n), "nodes") for n in (1, 2)
    }
    assert all(result.exit_code == 0 for result in out.values()), out
    assert "ONE node, so the locks are only as safe as this one Redis Cluster" in out[1].output
    assert "redlock_min_replicas" not in out[1].output  # every shard has its one replica
    short = [line for line in out[2].output.splitlines() if line.startswith("WARNING")]
    assert len(short) == 1 and "1 replica connected, redlock_min_replicas is 2" in short[0]
    for master in cluster.masters:  # each shard weighed on its own
        assert f"{cluster.url} shard {master.host}:{master.port}" in short[0]


# -- status --------------------------------------------------------------------


def test_status_shows_the_holder(app, redis_nodes3):
    lease = hold(app, 7, "task-aaa")
    result = invoke(app, "status", cli_app.SETTLE, "--args", "[7]")
    assert result.exit_code == 0, result.output
    assert lease.key in result.output
    assert "Holder:       task task-aaa" in result.output
    assert result.output.count(lease.owner) == 1 + 3  # the quorum line, then each node
    assert str(lease.fencing_token) in result.output

    # The same lock by keyword, and as JSON.
    data = json.loads(
        invoke(app, "status", cli_app.SETTLE, "--kwargs", '{"account_id": 7}', "--json").output
    )
    assert data["key"] == lease.key and data["held"] is True
    assert data["holder"]["task_id"] == "task-aaa" and data["holder"]["nodes"] == 3
    assert 0 < data["holder"]["remaining"] <= 60
    assert [n["fence"] for n in data["nodes"]] == [str(lease.fencing_token)] * 3
    assert [n["node"] for n in data["nodes"]] == redis_nodes3.urls


def test_status_of_a_free_lock_and_by_name(app):
    lease = hold(app, 7, "task-aaa")
    result = invoke(app, "status", cli_app.SETTLE, "--args", "[8]")
    assert result.exit_code == 0, result.output
    assert "none: the lock is free" in result.output
    # --name takes the name `list` prints, or the full key.
    for name in (lease.name, lease.key):
        result = invoke(app, "status", "--name", name)
        assert result.exit_code == 0, result.output
        assert "task task-aaa" in result.output


def test_status_shows_a_rated_keys_starts_window_and_next_start(app):
    plan = plan_of(app.tasks[cli_app.SYNC])
    name = plan.keys.build([5], {})
    rates = [
        RateKey(plan.redlock.coalesce_key(name, "rate"), parse_rate("10/m"), 1,
                plan.redlock.coalesce_key(name, "starts"))
    ]  # fmt: skip
    # the first start runs now, 4 more are booked 6 s apart; 2 others start on
    # bookings made before (the round only records them): 3 starts recorded
    leases = [plan.redlock.try_acquire(f"sync-{i}", ttl=5, rates=rates) for i in range(5)]
    assert [type(r).__name__ for r in leases] == ["Lease"] + ["RateSlot"] * 4
    for i in range(2):
        started = plan.redlock.try_acquire(f"again-{i}", ttl=5, rates=rates, booked=True)
        plan.redlock.release(started)
    plan.redlock.release(leases[0])
    result = invoke(app, "status", cli_app.SYNC, "--args", "[5]")
    assert result.exit_code == 0, result.output
    assert "Rate:         10/m, burst 1" in result.output
    assert "3 of 10 started in the last 60 s (4 booked ahead" in result.output
    data = json.loads(invoke(app, "status", cli_app.SYNC, "--args", "[5]", "--json").output)
    assert data["rate"]["rate"] == ["10/m"]
    assert data["rate"]["windows"][0]["starts"] == 3
    assert data["rate"]["windows"][0]["booked_ahead"] == 4
    assert abs(data["rate"]["next_start"] - (leases[-1].start_at + 6)) < 0.002
    assert 25 < data["rate"]["wait"] <= 30
    # another customer's key has nothing booked or started: due now
    data = json.loads(invoke(app, "status", cli_app.SYNC, "--args", "[6]", "--json").output)
    assert data["rate"]["windows"][0]["starts"] == 0 and data["rate"]["wait"] == 0


def test_status_without_a_quorum_exits_2(app, redis_nodes3):
    hold(app, 7, "task-aaa")
    redis_nodes3.kill(0)
    redis_nodes3.kill(2)
    result = invoke(app, "status", cli_app.SETTLE, "--args", "[7]")
    assert result.exit_code == 2, result.output
    assert "unknown: only 1 of 3 nodes answered" in result.stdout
    assert "only 1 of 3 lock nodes answered, 2 needed" in result.stderr
    data = json.loads(invoke(app, "status", cli_app.SETTLE, "--args", "[7]", "--json").stdout)
    assert data["held"] is False and "error" in data


def test_status_and_release_take_the_lock_on_arguments_alone(app, redis_nodes3):
    """An operator knows the order id, not the amount: ``charge(order_id, amount)``."""

    @app.task(base=LockedTask, shared=False, name="cli.charge", lock_on={"order_id": int})
    def charge(order_id: int, amount: int) -> None:
        return None

    @app.task(base=LockedTask, shared=False, name="cli.pair", lock_on=("amount", "order_id"))
    def pair(order_id: int, amount: int) -> None:
        return None

    plan = plan_of(app.tasks["cli.charge"])
    # Held as the worker keys the call charge("7", 100): a string, as a web form sends it.
    lease = plan.redlock.acquire(
        plan.keys.build(["7", 100], {}), ttl=60, owner=make_owner("task-aaa", 0)
    )
    for given in (["--args", "[7]"], ["--kwargs", '{"order_id": "7"}'], ["--args", "[7, 5]"]):
        result = invoke(app, "status", "cli.charge", *given)
        assert result.exit_code == 0, (given, result.output)
        assert lease.key in result.output and "Holder:       task task-aaa" in result.output

    # Arguments that fit the whole call and the lock_on order with different keys.
    result = invoke(app, "status", "cli.pair", "--args", "[1, 2]")
    assert result.exit_code == 1
    assert "fit both the whole call of cli.pair and its lock_on arguments" in result.output
    assert invoke(app, "status", "cli.pair", "--kwargs", '{"order_id": 1}').exit_code == 1
    result = invoke(app, "status", "cli.pair", "--kwargs", '{"order_id": 1, "amount": 2}')
    assert result.exit_code == 0, result.output

    result = invoke(app, "release", "cli.charge", "--args", "[7]", "--task-id", "task-aaa")
    assert result.exit_code == 0, result.output
    assert "on 3 of 3 nodes (held by task task-aaa)" in result.output
    assert redis_nodes3.keys("redlock:lock:*") == {0: [], 1: [], 2: []}


def test_unknown_task_lists_the_locked_tasks(app):
    result = invoke(app, "status", "no.such.task")
    assert result.exit_code == 1
    assert "'no.such.task' is not a task registered in the app" in result.output
    assert f"The app's LockedTasks: {cli_app.SETTLE}" in result.output
    result = invoke(app, "release", cli_app.PLAIN, "--force")
    assert result.exit_code == 1
    assert f"'{cli_app.PLAIN}' is not a LockedTask" in result.output


def test_arguments_that_do_not_fit_are_a_clear_error(app):
    result = invoke(app, "status", cli_app.SETTLE, "--args", "[1, 2, 3, 4]")
    assert result.exit_code == 1
    assert (
        "cannot build the lock key" in result.output
        and "arguments do not match run" in result.output
        and "nor are they the lock_on arguments alone" in result.output
        and "4 values given, lock_on selects 1: account_id" in result.output
    )
    assert invoke(app, "status").exit_code == 2  # click usage error: no lock named
    assert invoke(app, "status", "--name", "x", "--args", "[1]").exit_code == 2


# -- list ----------------------------------------------------------------------


def test_list_finds_held_locks(any_app, nodes3):
    needs_three(nodes3)
    app = any_app
    first = hold(app, 7, "task-aaa")
    second = hold(app, 8, "task-bbb")
    # A key on one node only is shown, but not held by a quorum.
    with nodes3[0].client() as client:
        client.set("redlock:lock:{stray}", "task-ccc|0|h|1|r", px=60000)

    result = invoke(app, "list")
    assert result.exit_code == 0, result.output
    assert first.name in result.output and second.name in result.output
    assert "task task-aaa" in result.output and "task task-bbb" in result.output
    assert "{stray}" in result.output and "no majority (1/3 with a key)" in result.output
    assert "3 keys, 2 held by a quorum." in result.output

    only_task = invoke(app, "list", cli_app.SETTLE)
    assert "{stray}" not in only_task.output and "2 keys, 2 held by a quorum." in only_task.output

    limited = invoke(app, "list", "--limit", "1")
    assert "1 key," in limited.output and "Stopped at --limit 1" in limited.output


EXPORT = "cli.export"


def test_status_and_list_show_the_permits_of_a_key(app):
    @app.task(base=LockedTask, shared=False, name=EXPORT, lock_on=("customer",), lock_limit=3)
    def export(customer: int) -> None:
        return None

    plan = plan_of(app.tasks[EXPORT])
    name = plan.keys.build([7], {})
    leases = [
        plan.redlock.acquire(name, ttl=60, limit=3, owner=make_owner(task_id, 0))
        for task_id in ("task-p0", "task-p1")
    ]
    assert [lease.permit for lease in leases] == [0, 1]
    plan.redlock.release(leases[0])  # permit 0 (the lock key) free, permit 1 held

    result = invoke(app, "status", EXPORT, "--args", "[7]")
    assert result.exit_code == 0, result.output
    assert "1 of 3 held" in result.output
    lines = [line.split() for line in result.output.splitlines() if line.strip()]
    rows = {line[0]: line for line in lines if line[0] in ("0", "1", "2")}
    assert rows["0"][1] == "-" and rows["2"][1] == "-"
    assert rows["1"][1:3] == ["task", "task-p1"] and 50 < float(rows["1"][3]) <= 60
    data = json.loads(invoke(app, "status", EXPORT, "--args", "[7]", "--json").stdout)
    assert data["limit"] == 3
    assert [p["holder"] and p["holder"]["task_id"] for p in data["permits"]] == [
        None,
        "task-p1",
        None,
    ]
    assert 50 < data["permits"][1]["holder"]["remaining"] <= 60

    listed = invoke(app, "list", EXPORT)
    assert f"{name} permit 1" in listed.output and "task task-p1" in listed.output
    assert "1 key, 1 held by a quorum." in listed.output
    assert f"{name} permit 1" in invoke(app, "list").output
    plan.redlock.release(leases[1])


def test_list_without_a_quorum_exits_2(app, redis_nodes3):
    hold(app, 7, "task-aaa")
    redis_nodes3.kill(1)
    redis_nodes3.kill(2)
    result = invoke(app, "list")
    assert result.exit_code == 2
    assert "unknown (1/3 answered)" in result.stdout
    assert redis_nodes3.urls[1] in result.stderr and redis_nodes3.urls[2] in result.stderr


def test_list_a_hung_node_costs_one_timeout(app, redis_nodes3):
    for account in range(10):
        hold(app, account, f"task-{account}")
    redis_nodes3.pause(0)
    started = time.monotonic()
    result = invoke(app, "list", "--timeout", "0.2")
    assert time.monotonic() - started < 1.5  # not one timeout per key
    assert result.exit_code == 0, result.output
    assert "10 keys, 10 held by a quorum." in result.output
    assert f"DOWN    {redis_nodes3.urls[0]}" in result.output


# -- release -------------------------------------------------------------------


def test_release_task_id_frees_only_the_matching_holder(app, redis_nodes3):
    lease = hold(app, 7, "task-aaa")
    result = invoke(app, "release", cli_app.SETTLE, "--args", "[7]", "--task-id", "task-bbb")
    assert result.exit_code == 1
    assert "is not held by task task-bbb" in result.output
    assert all(keys == [lease.key] for keys in redis_nodes3.keys("redlock:lock:*").values())

    # A task id that only prefixes the holder's is not the holder.
    assert (
        invoke(app, "release", cli_app.SETTLE, "--args", "[7]", "--task-id", "task-a").exit_code
        == 1
    )

    result = invoke(app, "release", cli_app.SETTLE, "--args", "[7]", "--task-id", "task-aaa")
    assert result.exit_code == 0, result.output
    assert "on 3 of 3 nodes (held by task task-aaa)" in result.output
    assert redis_nodes3.keys("redlock:lock:*") == {0: [], 1: [], 2: []}
    assert all(keys == [lease.fence_key] for keys in redis_nodes3.keys("redlock:fence:*").values())


def test_release_force_asks_first_and_keeps_the_fence(app, redis_nodes3):
    lease = hold(app, 7, "task-aaa")

    result = invoke(app, "release", cli_app.SETTLE, "--args", "[7]", input="\n")  # default: no
    assert result.exit_code == 1 and "Aborted" in result.output
    assert "Holder: task task-aaa" in result.output
    assert all(keys == [lease.key] for keys in redis_nodes3.keys("redlock:lock:*").values())

    result = invoke(app, "release", cli_app.SETTLE, "--args", "[7]", input="y\n")
    assert result.exit_code == 0, result.output
    assert f"Deleted {lease.key} on 3 of 3 nodes." in result.output
    assert redis_nodes3.keys("redlock:lock:*") == {0: [], 1: [], 2: []}

    hold(app, 7, "task-bbb")
    result = invoke(app, "release", "--name", lease.name, "--force")
    assert result.exit_code == 0, result.output
    assert "[y/N]" not in result.output
    assert redis_nodes3.keys("redlock:lock:*") == {0: [], 1: [], 2: []}
    assert all(keys == [lease.fence_key] for keys in redis_nodes3.keys("redlock:fence:*").values())

    # The next grant's token is still larger than the stuck holder's.
    assert hold(app, 7, "task-ccc").fencing_token > lease.fencing_token
    assert (
        "Nothing to delete"
        in invoke(app, "release", cli_app.SETTLE, "--args", "[8]", "--force").output
    )


# -- beat-slots ----------------------------------------------------------------


def claimed_app(redis_nodes3):
    return cli_app.make_app(redis_nodes3.urls, redlock_enqueue="until_finished")


def test_list_shows_enqueue_claims_beside_locks(redis_nodes3):
    app = claimed_app(redis_nodes3)
    settle = app.tasks[cli_app.SETTLE]
    first = settle.apply_async((7,))  # claimed; the memory broker keeps the message
    later = settle.apply_async((8,), countdown=120)
    result = invoke(app, "list", cli_app.SETTLE)
    assert result.exit_code == 0, result.output
    assert "Enqueue claims of task cli.settle" in result.output
    assert first.id in result.output and later.id in result.output
    assert "due in 1" in result.output  # the countdown message is not due yet
    assert "2 claims, 2 waiting for their run." in result.output


def test_release_claim_asks_first_and_is_owner_checked(redis_nodes3):
    app = claimed_app(redis_nodes3)
    settle = app.tasks[cli_app.SETTLE]
    plan = plan_of(settle)
    name = plan.keys.build([7], {})
    first = settle.apply_async((7,))
    refused = invoke(app, "release", cli_app.SETTLE, "--args", "[7]", "--claim", input="n\n")
    assert refused.exit_code == 1 and first.id in refused.output
    assert plan.redlock.claimant(name).claimant == first.id
    other = invoke(app, "release", cli_app.SETTLE, "--args", "[7]", "--claim", "--task-id", "x")
    assert other.exit_code == 1 and "not claimed by task x" in other.output
    done = invoke(app, "release", cli_app.SETTLE, "--args", "[7]", "--claim", input="y\n")
    assert done.exit_code == 0, done.output
    assert "Withdrew redlock:claim:cli.settle:" in done.output
    assert plan.redlock.claimant(name).claimant is None
    assert settle.apply_async((7,)).id != first.id  # a later call is queued again
    again = invoke(app, "release", cli_app.SETTLE, "--args", "[7]", "--claim", "--force")
    assert again.exit_code == 0 and "Withdrew" in again.output


def test_beat_slots_lists_claims(app, redis_nodes3):
    claims = {
        "redlock:beat:nightly report:1714564800": "beat@host-a|pid 12|msg 3f2c",
        "redlock:beat:tick:1714564801": "beat@host-b|7|m-1",
        "redlock:beat:tick:fast:1714564802": "beat@host-b|7|m-2",
        "redlock:beat:weird[1]:1714564803": "beat@host-c|8|m-3",
    }
    for node in redis_nodes3:
        with node.client() as client:
            for key, value in claims.items():
                client.set(key, value, px=120_000)
    with redis_nodes3[2].client() as client:  # a node that disagrees
        client.set("redlock:beat:tick:1714564801", "beat@host-z|9|m-9", px=120_000)

    result = invoke(app, "beat-slots")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(
        line.split()[:4] == ["nightly", "report", "1714564800", "2024-05-01T12:00:00Z"]
        and line.endswith("beat@host-a|pid 12|msg 3f2c")
        for line in lines
    ), result.output
    assert any("2/3" in line and line.endswith("beat@host-b|7|m-1") for line in lines)
    assert any("1/3" in line and line.endswith("beat@host-z|9|m-9") for line in lines)
    assert "4 claims." in result.output

    # An entry filter matches the whole entry name, glob characters included.
    tick = invoke(app, "beat-slots", "tick").output
    assert "m-1" in tick and "m-2" not in tick and "1 claim." in tick
    weird = invoke(app, "beat-slots", "weird[1]").output
    assert "2024-05-01T12:00:03Z" in weird and "1 claim." in weird


# -- settings ------------------------------------------------------------------


def test_settings_masks_passwords_and_documents_each_setting():
    nodes = [
        "redis://:s3cret@127.0.0.1:1/0",
        "redis://user:pw2@127.0.0.1:2/0",
        "unix:///tmp/r.sock?password=pw3",
    ]
    app = cli_app.make_app(nodes, redlock_on_duplicate="retry")
    result = invoke(app, "settings")
    assert result.exit_code == 0, result.output
    assert "redis://:***@127.0.0.1:1/0" in result.output
    assert "redis://user:***@127.0.0.1:2/0" in result.output
    assert "password=***" in result.output
    assert (
        "s3cret" not in result.output and "pw2" not in result.output and "pw3" not in result.output
    )
    from celery_redlock.conf import SETTINGS

    for setting in SETTINGS:
        assert setting.name in result.output
        assert setting.doc.split()[0] in result.output
    assert any(
        line.split() == ["redlock_on_duplicate", "app.conf", "retry"]
        for line in result.output.splitlines()
    )
    assert any(
        line.split() == ["redlock_ttl", "default", "10"] for line in result.output.splitlines()
    )

    task = invoke(app, "settings", cli_app.SETTLE).output
    assert any(line.split() == ["redlock_ttl", "task.lock_ttl", "30"] for line in task.splitlines())
    assert any(
        line.split() == ["redlock_heartbeat_interval", "ttl", "/", "3", "10"]
        for line in task.splitlines()
    )


def test_mask_url():
    assert mask_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert mask_url("rediss://default:p@ss@host/1") == "rediss://default:***@host/1"
    assert mask_url("redis://host:6379/0, redis://:x@h2") == "redis://host:6379/0, redis://:***@h2"
    assert mask_url("unix:///r.sock?db=0&password=pw") == "unix:///r.sock?db=0&password=***"


# -- through celery's own command line -----------------------------------------


def celery_cli(*args: str, nodes: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "CRL_CLI_NODES": ",".join(nodes)}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.cli_app", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_entry_point_through_celery(redis_nodes3):
    """``redlock nodes`` as a health check, through Celery's own main: 0 all up,
    3 one of three down (a quorum answers), 2 two of three down."""
    proc = celery_cli("redlock", "nodes", nodes=redis_nodes3.urls)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for url in redis_nodes3.urls:
        assert url in proc.stdout
    assert "Quorum: reachable (3 of 3 nodes answered, 2 needed)\n" in proc.stdout
    assert proc.stderr == ""

    redis_nodes3.kill(0)  # SIGKILL by its pid: the port refuses connections
    proc = celery_cli("redlock", "nodes", nodes=redis_nodes3.urls)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert (
        "Quorum: reachable (2 of 3 nodes answered, 2 needed); DEGRADED: the quorum tolerates "
        "no further node failure" in proc.stdout
    )
    assert "Traceback" not in proc.stderr
    assert (
        f"2 of 3 lock nodes answered, the quorum tolerates no further node failure; "
        f"down: {redis_nodes3.urls[0]} (" in proc.stderr
    )

    redis_nodes3.kill(1)
    proc = celery_cli("redlock", "nodes", nodes=redis_nodes3.urls)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Quorum: UNREACHABLE (1 of 3 nodes answered, 2 needed)\n" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert redis_nodes3.urls[0] in proc.stderr and redis_nodes3.urls[1] in proc.stderr


def test_schema_prints_and_applies_the_sql_of_the_postgres_nodes(postgres_node1):
    app = cli_app.make_app(postgres_node1.urls)
    printed = invoke(app, "schema")
    assert printed.exit_code == 0, printed.output
    assert "CREATE TABLE IF NOT EXISTS redlock.kv" in printed.output
    assert "CREATE OR REPLACE FUNCTION redlock.run(" in printed.output
    server = postgres_node1[0]
    server.sql("DROP SCHEMA IF EXISTS redlock CASCADE")
    applied = invoke(app, "schema", "--apply")
    assert applied.exit_code == 0, applied.output
    assert "schema 'redlock' is installed" in applied.output
    assert server.sql("SELECT version FROM redlock.meta") == [(VERSION,)]


def test_schema_with_no_postgres_node_says_so(redis_nodes3):
    result = invoke(cli_app.make_app(redis_nodes3.urls), "schema")
    assert result.exit_code == 1
    assert "has no PostgreSQL lock node" in result.output
