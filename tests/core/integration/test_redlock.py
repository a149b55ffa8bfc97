"""The Redlock core on lock nodes of every kind (3 and 5 Redis masters, 3
Redis Clusters, 3 PostgreSQL servers and 1 alone, 1 etcd cluster, 3 memory
nodes: tests/support/kinds.py), all healthy.

Node failures (kill, SIGSTOP, restart) are in tests/core/faults/test_redlock_faults.py.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

from celery_redlock.exceptions import LockContended, LockNotAcquired, QuorumUnavailable
from celery_redlock.redlock import Holder, Lease, Redlock, make_owner
from tests.support.healthy import HEALTHY_NODE_TIMEOUT, healthy
from tests.support.kinds import needs_shared, params
from tests.support.polling import wait_for
from tests.support.recorded_grants import grant_loop
from tests.support.ttl import left_at_least

pytestmark = pytest.mark.integration

NAME = "job"


@pytest.fixture(**params(lambda s: s.core or s.id == "5masters"))
def nodes(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(**params(lambda s: s.kind == "redis"))
def redis_nodes(request):
    """For what only Redis nodes have (a script cache)."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def recorder(redis_node_factory):
    """A redis-server outside the quorum, where critical sections leave their trace."""
    return redis_node_factory(1)[0]


def lock_keys(nodes, rl: Redlock, name: str = NAME) -> dict[int, list[str]]:
    lock_key, fence_key = rl.keys(name)
    return {i: [k for k in keys if k in (lock_key, fence_key)] for i, keys in nodes.keys().items()}


def node_values(nodes, key: str) -> list:
    out = []
    for node in nodes:
        with node.client() as client:
            out.append(client.get(key))
    return out


# -- mutual exclusion -------------------------------------------------------------


def contend(
    urls,
    recorder_url,
    name,
    target,
    seconds,
    start=None,
    per_worker_names=False,
    index=0,
    processes=0,
):
    """The shared grant loop, with every worker starting together (``start``) and,
    for the control run, each locking its own name."""
    if start is not None:
        start.wait(30)  # every process and thread starts together
    if per_worker_names:
        name = f"{name}-{index}"
    grant_loop(
        urls,
        recorder_url,
        name,
        target,
        seconds,
        hold=0.0005,
        node_timeout=HEALTHY_NODE_TIMEOUT,
        processes=processes,
    )


def run_threads(n, *args, **kwargs):
    threads = [
        threading.Thread(target=contend, args=args, kwargs=dict(kwargs, index=i)) for i in range(n)
    ]
    for thread in threads:
        thread.start()
    return threads


def results(recorder):
    with recorder.client() as rec:
        tokens = [int(t) for t in rec.lrange("tokens", 0, -1)]
        who = rec.lrange("who", 0, -1)
        overlaps = int(rec.get("overlaps") or 0)
        occupancy = int(rec.get("occupancy") or 0)
        assert rec.get("quorum_errors") is None  # all nodes are healthy here
    return tokens, who, overlaps, occupancy


def test_mutual_exclusion_across_threads_and_processes(nodes, recorder):
    needs_shared(nodes)
    # stop at 150 grants once every process held the lock (a process a busy host
    # starves is waited for); after 20 s at the latest
    target, seconds = 150, 20.0
    procs, threads_per_proc = 2, 3
    ctx = multiprocessing.get_context("fork")  # the parent has no thread running yet
    start = ctx.Barrier(procs + 1)
    children = [
        ctx.Process(
            target=_process_main,
            args=(threads_per_proc, nodes.urls, recorder.url, NAME, target, seconds, start, 3),
        )
        for _ in range(procs)
    ]
    for child in children:
        child.start()
    try:
        start.wait(30)
        t0 = time.monotonic()
        threads = run_threads(3, nodes.urls, recorder.url, NAME, target, seconds, processes=3)
        for thread in threads:
            thread.join(30)
        for child in children:
            child.join(30)
        elapsed = time.monotonic() - t0
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
    assert [child.exitcode for child in children] == [0] * procs
    tokens, who, overlaps, occupancy = results(recorder)
    print(f"{len(tokens)} grants in {elapsed:.2f}s, {overlaps} overlaps")  # shown with -s
    assert overlaps == 0, f"{overlaps} overlapping critical sections in {len(tokens)} grants"
    assert occupancy == 0
    assert len(tokens) >= 30, f"only {len(tokens)} grants in {elapsed:.1f}s"
    pids = {w.split(":")[0] for w in who}
    assert str(os.getpid()) in pids and len(pids) == 3, "every process must have held the lock"
    assert all(b > a for a, b in zip(tokens, tokens[1:])), "tokens must grow in grant order"
    assert lock_keys(nodes, healthy(nodes.urls))[0] == [healthy(nodes.urls).keys(NAME)[1]]


def _process_main(n_threads, urls, recorder_url, name, target, seconds, start, processes=0):
    start.wait(30)
    threads = run_threads(n_threads, urls, recorder_url, name, target, seconds, processes=processes)
    for thread in threads:
        thread.join(30)


def test_the_overlap_detector_sees_overlaps_without_a_common_lock(redis_nodes3, recorder):
    """The same harness, each worker locking its own name: overlaps must be seen,
    so the zero above is a measurement, not a tautology."""
    threads = run_threads(
        4, redis_nodes3.urls, recorder.url, NAME, 10**9, 0.3, per_worker_names=True
    )
    for thread in threads:
        thread.join(10)
    tokens, who, overlaps, _ = results(recorder)
    print(f"without a common lock: {overlaps} overlaps in {len(tokens)} grants")  # shown with -s
    assert overlaps > 0
    assert len(tokens) > 20


# -- blocking, context manager, holder ---------------------------------------------


def test_blocking_acquire_with_timeout_returns_none_in_about_the_timeout(nodes):
    rl = healthy(nodes.urls)
    held = rl.acquire(NAME, ttl=10)
    assert held is not None
    start = time.monotonic()
    assert rl.acquire(NAME, ttl=10, blocking=True, timeout=0.3) is None
    elapsed = time.monotonic() - start
    # the timeout, then at most the last attempt's round: not a hang
    assert 0.3 <= elapsed < 0.3 + HEALTHY_NODE_TIMEOUT, elapsed
    assert rl.holder(NAME).owner == held.owner  # the failed attempts took nothing away


def test_blocking_acquire_gets_the_lock_once_released(nodes):
    rl = healthy(nodes.urls)
    held = rl.acquire(NAME, ttl=10)
    timer = threading.Timer(0.2, rl.release, (held,))
    timer.start()
    start = time.monotonic()
    lease = rl.acquire(NAME, ttl=10, blocking=True, timeout=3, retry_delay_max=0.05)
    elapsed = time.monotonic() - start
    timer.join()
    assert lease is not None and lease.fencing_token > held.fencing_token
    assert 0.2 <= elapsed < 1.5, elapsed  # at the release, well before the 3 s timeout


def test_lock_context_manager_raises_lock_contended_naming_the_holder(nodes):
    rl = healthy(nodes.urls)
    owner = make_owner("task-123")
    held = rl.acquire(NAME, ttl=10, owner=owner)
    assert held is not None
    with pytest.raises(LockContended) as info:
        with rl.lock(NAME, ttl=10, timeout=0.1):
            pytest.fail("the body must not run")  # pragma: no cover
    error = info.value
    assert isinstance(error, LockNotAcquired)
    assert error.holder == owner and error.name == NAME
    assert "task-123" in str(error) and owner in str(error)
    assert 9 < error.remaining <= 10


def test_lock_context_manager_releases_on_exit_even_on_error(nodes):
    rl = healthy(nodes.urls)
    lock_key, fence_key = rl.keys(NAME)
    with rl.lock(NAME, ttl=10) as lease:
        assert isinstance(lease, Lease) and not lease.lost
        assert node_values(nodes, lock_key) == [lease.owner] * len(nodes)
    assert lease.lost
    assert node_values(nodes, lock_key) == [None] * len(nodes)
    with pytest.raises(ZeroDivisionError):
        with rl.lock(NAME, ttl=10) as second:
            raise ZeroDivisionError
    assert second.fencing_token > lease.fencing_token
    assert node_values(nodes, lock_key) == [None] * len(nodes)
    # the fence value stays (by design): the next grant must see it. A quorum holds
    # the token; a node whose seed fell on the other side of a second boundary
    # (the seed takes the node's clock to the second) may hold less, never more
    values = node_values(nodes, fence_key)
    assert values.count(str(second.fencing_token)) >= len(nodes) // 2 + 1, values
    assert max(int(v) for v in values) == second.fencing_token, values


def test_holder(nodes):
    rl = healthy(nodes.urls)
    assert rl.holder(NAME) == Holder(None, None)
    owner = make_owner("task-9", retries=2)
    lease = rl.acquire(NAME, ttl=10, owner=owner)
    found = rl.holder(NAME)
    assert found.owner == owner and found.task_id == "task-9" and found.retries == 2
    assert 9.5 < found.remaining <= 10
    rl.release(lease)
    assert rl.holder(NAME) == Holder(None, None)


def test_holder_needs_a_majority_to_agree(redis_nodes5):
    rl = healthy(redis_nodes5.urls)
    lock_key, _ = rl.keys(NAME)
    for i, owner in enumerate(["a|-|h|1|x", "a|-|h|1|x", "b|-|h|2|y", "b|-|h|2|y"]):
        with redis_nodes5[i].client() as client:
            client.set(lock_key, owner, px=10_000)
    assert rl.holder(NAME) == Holder(None, None)
    with redis_nodes5[4].client() as client:
        client.set(lock_key, "a|-|h|1|x", px=5_000)
    found = rl.holder(NAME)
    assert found.owner == "a|-|h|1|x" and 4 < found.remaining <= 5  # the smallest PTTL


# -- release, release_owned_by, claim --------------------------------------------


def test_release_frees_only_my_own_value(nodes):
    rl = healthy(nodes.urls)
    lease = rl.acquire(NAME, ttl=10)
    lock_key, _ = rl.keys(NAME)
    with nodes[0].client() as client:
        client.set(lock_key, "someone-else")
    rl.release(lease)
    assert lease.lost
    assert node_values(nodes, lock_key) == ["someone-else"] + [None] * (len(nodes) - 1)


def test_release_not_waited_for_frees_every_node_and_is_never_read_as_a_later_reply(nodes):
    """``release(wait=False)`` returns once the release is written: another client sees
    the key gone from every node right after, and the next rounds on the same
    connections set the owed replies aside, so each grant reads its own reply."""
    rl = healthy(nodes.urls)
    other = healthy(nodes.urls)
    gone = [None] * len(nodes)
    tokens = []
    for i in range(20):
        lease = rl.acquire(NAME, ttl=10, owner=make_owner(f"task-{i}", 0))
        assert isinstance(lease, Lease)
        tokens.append(lease.fencing_token)
        rl.release(lease, receipt=60, wait=False)
        assert lease.lost
        wait_for(lambda key=lease.key: node_values(nodes, key) == gone, 5, "the release")
        assert other.holder(NAME).owner is None
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens
    receipts = [rl.receipt_key(NAME, f"task-{i}") for i in range(20)]
    assert all(None not in node_values(nodes, key) for key in receipts)
    # Owed replies on every connection: an extend, a holder and a release still read their own.
    lease = rl.acquire(NAME, ttl=10)
    rl.release(rl.acquire("another", ttl=10), wait=False)
    assert rl.extend(lease) is True
    assert rl.holder(NAME).owner == lease.owner
    rl.release(lease)
    assert node_values(nodes, lease.key) == [None] * len(nodes)


def test_release_owned_by_frees_a_task_lock_whatever_its_random_part(nodes):
    rl = healthy(nodes.urls)
    lock_key, _ = rl.keys(NAME)
    rl.acquire(NAME, ttl=10, owner=make_owner("task-7", retries=0))
    assert rl.release_owned_by(NAME, "task-70") == 0  # a prefix of the id is not the id
    assert rl.release_owned_by(NAME, "task") == 0
    assert rl.release_owned_by("other", "task-7") == 0
    assert rl.holder(NAME).task_id == "task-7"
    assert rl.release_owned_by(NAME, "task-7") == len(nodes)
    assert node_values(nodes, lock_key) == [None] * len(nodes)
    assert rl.release_owned_by(NAME, "task-7") == 0
    assert rl.acquire(NAME, ttl=10) is not None


def test_claim(nodes):
    rl = healthy(nodes.urls)
    claimed = time.monotonic()
    assert rl.claim("beat:tick:1700000000", "beat-a", ttl=60) is True
    assert rl.claim("beat:tick:1700000000", "beat-b", ttl=60) is False
    assert rl.claim("beat:tick:1700000000", "beat-a", ttl=60) is True  # re-sent: still mine
    assert rl.claim("beat:tick:1700000060", "beat-b", ttl=60) is True  # another slot
    assert node_values(nodes, "redlock:beat:tick:1700000000") == ["beat-a"] * len(nodes)
    for node in nodes:
        with node.client() as client:
            left = client.pttl("redlock:beat:tick:1700000000")
            assert left_at_least(claimed, 60_000) <= left <= 60_000


def test_claim_that_lost_the_majority_is_withdrawn(redis_nodes5):
    rl = healthy(redis_nodes5.urls)
    for i in range(3):
        with redis_nodes5[i].client() as client:
            client.set("redlock:slot", "other", px=60_000)
    assert rl.claim("slot", "mine", ttl=60) is False
    assert node_values(redis_nodes5, "redlock:slot") == ["other"] * 3 + [None] * 2


# -- contention leaves nothing behind ----------------------------------------------


@pytest.mark.parametrize("fence", [True, False], ids=["fenced", "bare-set-nx"])
def test_failed_contended_acquire_leaves_no_key(redis_nodes5, fence):
    """Grants on a minority (3, 4) are withdrawn; their fence values moved on, no more
    (a lazy acquire, a bare SET NX where the nodes grant it, moves none)."""
    rl = healthy(redis_nodes5.urls)
    lock_key, fence_key = rl.keys(NAME)
    since = time.monotonic()
    for i in range(3):
        with redis_nodes5[i].client() as client:
            client.set(lock_key, "holder|-|h|1|x", px=10_000)
    result = rl.try_acquire(NAME, ttl=10, fence=fence)
    assert isinstance(result, Holder) and result.owner == "holder|-|h|1|x" and not result.claimant
    assert left_at_least(since, 10_000) / 1000 <= result.remaining <= 10
    assert rl.acquire(NAME, ttl=10, fence=fence) is None
    assert node_values(redis_nodes5, lock_key) == ["holder|-|h|1|x"] * 3 + [None] * 2
    fences = node_values(redis_nodes5, fence_key)
    if not fence:
        assert fences == [None] * 5
        return
    assert fences[:3] == [None] * 3 and fences[3] is not None and fences[4] is not None
    assert {i: k for i, k in lock_keys(redis_nodes5, rl).items() if i >= 3} == {
        3: [fence_key],
        4: [fence_key],
    }


def test_split_vote_leaves_no_key_and_no_holder(redis_nodes5):
    rl = healthy(redis_nodes5.urls)
    lock_key, _ = rl.keys(NAME)
    for i, owner in enumerate(["a", "a", "b", "b"]):
        with redis_nodes5[i].client() as client:
            client.set(lock_key, owner, px=10_000)
    assert rl.acquire(NAME, ttl=10) is None
    assert node_values(redis_nodes5, lock_key) == ["a", "a", "b", "b", None]


# -- fencing tokens, extend, scripts -----------------------------------------------


def test_tokens_grow_across_clients_and_the_fence_is_kept(nodes):
    a = healthy(nodes.urls, fence_retention=3600)
    b = healthy(nodes.urls, fence_retention=3600)
    tokens = []
    began = time.monotonic()
    for i in range(20):
        client = (a, b)[i % 2]
        lease = client.acquire(NAME, ttl=10)
        tokens.append(lease.fencing_token)
        client.release(lease)
    assert all(y > x for x, y in zip(tokens, tokens[1:]))
    _, fence_key = a.keys(NAME)
    assert node_values(nodes, fence_key) == [str(tokens[-1])] * len(nodes)
    for node in nodes:
        with node.client() as client:
            assert left_at_least(began, 3_600_000) <= client.pttl(fence_key) <= 3_600_000
    # the token is at least the nodes' clock in microseconds
    with nodes[0].client() as client:
        seconds, micros = client.time()
    assert abs(tokens[-1] - (seconds * 1_000_000 + micros)) < 5_000_000


def test_fencing_off_gives_no_token_and_writes_no_fence(nodes):
    rl = healthy(nodes.urls, fencing=False)
    lease = rl.acquire(NAME, ttl=10)
    assert lease is not None and lease.fencing_token is None
    assert lock_keys(nodes, rl) == {i: [rl.keys(NAME)[0]] for i in range(len(nodes))}


def test_extend_sets_the_ttl_on_every_node(nodes):
    # The bounds tell "set" from "left alone" (2 s, then 30 s) and from "added" (32 s),
    # with seconds to spare for a loaded host.
    rl = healthy(nodes.urls)
    lease = rl.acquire(NAME, ttl=2)
    assert rl.extend(lease, ttl=30) is True
    for node in nodes:
        with node.client() as client:
            assert 20_000 < client.pttl(lease.key) <= 30_000
    assert 20 < lease.remaining() <= 30
    assert rl.extend(lease) is True  # back to its own TTL: set, not added (32 s)
    for node in nodes:
        with node.client() as client:
            assert 0 < client.pttl(lease.key) <= 2_000


def test_acquire_is_idempotent_for_the_same_owner(nodes):
    rl = healthy(nodes.urls)
    owner = make_owner()
    first = rl.acquire(NAME, ttl=10, owner=owner)
    again = rl.acquire(NAME, ttl=10, owner=owner)  # a re-sent acquire: the same grant
    assert again is not None and again.fencing_token == first.fencing_token
    assert healthy(nodes.urls).acquire(NAME, ttl=10) is None


def _calls(nodes, command: str) -> list[int]:
    out = []
    for node in nodes:
        with node.client() as client:
            out.append(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))
    return out


def test_an_acquire_with_no_fence_to_move_is_a_bare_set_nx(redis_nodes3):
    rl = healthy(redis_nodes3.urls)
    sets, scripts = _calls(redis_nodes3, "set"), _calls(redis_nodes3, "evalsha")
    lease = rl.acquire(NAME, ttl=10, fence=False)
    assert lease is not None
    assert _calls(redis_nodes3, "set") == [n + 1 for n in sets]
    assert _calls(redis_nodes3, "evalsha") == scripts  # no script ran on any node
    assert node_values(redis_nodes3, lease.key) == [lease.owner] * 3
    fenced = healthy(redis_nodes3.urls, fencing=False)  # fencing off: the same bare round
    assert fenced.acquire(NAME, ttl=10) is None
    # refused: ACQUIRE says who holds it, then the failed attempt's release
    assert _calls(redis_nodes3, "evalsha") == [n + 2 for n in scripts]


def test_a_bare_set_nx_re_sent_where_the_key_is_mine_is_granted_and_refreshed(redis_nodes3):
    """A node whose SET NX reply was lost already holds my value: the re-sent acquire
    finds it mine there (the script's second round) and sets its TTL again."""
    rl = healthy(redis_nodes3.urls)
    owner = make_owner()
    lock_key, _ = rl.keys(NAME)
    with redis_nodes3[0].client() as client:
        client.set(lock_key, owner, px=1_000)
    lease = rl.acquire(NAME, ttl=10, owner=owner, fence=False)
    assert lease is not None and not lease.lost
    assert node_values(redis_nodes3, lock_key) == [owner] * 3
    with redis_nodes3[0].client() as client:
        assert client.pttl(lock_key) > 9_000
    assert rl.acquire(NAME, ttl=10, owner=owner, fence=False) is not None  # all three mine
    assert healthy(redis_nodes3.urls).acquire(NAME, ttl=10, fence=False) is None


def test_lost_script_cache_falls_back_to_eval(redis_nodes):
    nodes = redis_nodes
    rl = healthy(nodes.urls)
    rl.release(rl.acquire(NAME, ttl=10))
    evals_before = []
    for node in nodes:
        with node.client() as client:
            client.script_flush()  # what a restart does to the cache
            evals_before.append(client.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))
    lease = rl.acquire(NAME, ttl=10)
    assert lease is not None
    assert rl.extend(lease) is True
    assert node_values(nodes, lease.key) == [lease.owner] * len(nodes)
    for node, before in zip(nodes, evals_before):
        with node.client() as client:
            stats = client.info("commandstats")
            # acquire and extend (the nodes agree: no fence round): each EVAL'd once
            assert stats["cmdstat_eval"]["calls"] == before + 2
            assert stats["cmdstat_evalsha"]["failed_calls"] >= 2  # the NOSCRIPT replies
    rl.release(lease)
    assert node_values(nodes, lease.key) == [None] * len(nodes)


def test_quorum_unavailable_is_not_raised_for_contention(nodes):
    rl = healthy(nodes.urls)
    rl.acquire(NAME, ttl=10)
    try:
        assert rl.acquire(NAME, ttl=10) is None
    except QuorumUnavailable:  # pragma: no cover
        pytest.fail("contention reported as an outage")


def test_eager_and_lazy_grants_from_two_threads_issue_increasing_tokens(nodes):
    """A few hundred grants, alternating fence=True / fence=False, from two threads and two
    clients. Inside the lock each thread appends the token it issued (the lock orders the
    appends) and checks that a quorum records it; a third of the lazy leases never read
    theirs. Every issued token must be larger than the one before it."""
    issued: list[int] = []
    unread: list[int] = [0]
    missing: list[tuple] = []  # tokens handed out but not recorded on a quorum
    errors: list[BaseException] = []
    per_thread = 150

    def work(index: int) -> None:
        rl = healthy(nodes.urls)
        try:
            for i in range(per_thread):
                eager = (i + index) % 2 == 0
                lease = None
                while lease is None:
                    lease = rl.acquire(
                        NAME,
                        ttl=5,
                        blocking=True,
                        timeout=1,
                        retry_delay=0.001,
                        retry_delay_max=0.005,
                        fence=eager,
                    )
                try:
                    if eager or i % 3:
                        issued.append(lease.fencing_token)
                        fences = [r.get("fence") for r in rl.inspect(NAME)]
                        if fences.count(str(issued[-1])) < rl.quorum:
                            missing.append((eager, issued[-1], fences))
                    else:
                        unread[0] += 1
                finally:
                    rl.release(lease)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert not missing, missing[:3]
    assert len(issued) + unread[0] == 2 * per_thread and unread[0] > 0
    assert all(y > x for x, y in zip(issued, issued[1:]))
    _, fence_key = healthy(nodes.urls).keys(NAME)
    # the last token is on a quorum; unread grants and withdrawn attempts may have moved on
    at_least = [int(v) >= issued[-1] for v in node_values(nodes, fence_key)]
    assert at_least.count(True) >= healthy(nodes.urls).quorum
