"""The in-memory kind: ``Redlock(["memory://a", "memory://b", "memory://c"])`` as a
lock of its own, its fault hooks, and how it refuses bad input."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from celery_redlock.core.nodes import node_for
from celery_redlock.core.nodes.memory import store_of
from celery_redlock.exceptions import ConfigurationError, QuorumUnavailable
from celery_redlock.redlock import Redlock
from celery_redlock.testing.memory import MemoryNodes

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def names():
    """Three memory node URLs of fresh names, emptied after the test."""
    tag = uuid.uuid4().hex[:8]
    urls = [f"memory://{tag}{n}" for n in "abc"]
    yield urls
    for url in urls:
        store_of(url[len("memory://") :]).flush()


def test_three_memory_nodes_exclude_threads_with_growing_tokens_and_leave_nothing(names):
    rl = Redlock(names, node_timeout=1.0)
    inside, overlaps, tokens = [0], [0], []
    guard = threading.Lock()

    def worker() -> None:
        done = 0
        while done < 40:
            lease = rl.acquire("job", ttl=5)
            if lease is None:
                continue
            with guard:
                inside[0] += 1
                overlaps[0] += inside[0] > 1
                tokens.append(lease.fencing_token)
            time.sleep(0.0005)
            with guard:
                inside[0] -= 1
            rl.release(lease)
            done += 1

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert overlaps[0] == 0 and len(tokens) == 240
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)  # strictly growing
    # permits: two at once, the third refused, then free again
    a, b = rl.acquire("pool", ttl=5, limit=2), rl.acquire("pool", ttl=5, limit=2)
    assert a is not None and b is not None and {a.permit, b.permit} == {0, 1}
    assert rl.acquire("pool", ttl=5, limit=2) is None
    assert rl.extend_many([a, b], ttl=10) == [True, True]
    for lease in (a, b):
        rl.release(lease)
    # nothing left but the fences, which outlive every lock on purpose
    for node in rl.nodes:
        left = [k.decode() for k in node.store.keys]
        assert all(":fence:" in key for key in left), left


def test_nodes_of_one_name_share_a_store_and_other_names_do_not(names):
    one, same = Redlock(names[:1]), Redlock(names[:1])
    lease = one.acquire("job", ttl=5)
    assert lease is not None and same.acquire("job", ttl=5) is None
    assert Redlock(names[1:2]).acquire("job", ttl=5) is not None


def test_a_minority_down_or_hung_still_grants_and_a_majority_does_not():
    with MemoryNodes(3) as nodes:
        rl = Redlock(nodes.urls, node_timeout=0.2)
        nodes.kill(0)
        nodes.pause(1)
        began = time.monotonic()
        with pytest.raises(QuorumUnavailable, match="1 of 3"):
            rl.acquire("job", ttl=5)
        assert time.monotonic() - began >= 0.2  # the hung node held the round to its deadline
        nodes.resume(1)
        lease = rl.acquire("job", ttl=5)
        assert lease is not None
        assert nodes.keys("*:lock:*") == {1: [lease.key], 2: [lease.key]}  # 0 is down
        nodes.restart(0)
        assert nodes.keys("*:lock:*")[0] == []  # up again, empty


def test_a_lost_reply_is_not_answering_though_the_write_stood():
    with MemoryNodes(3) as nodes:
        rl = Redlock(nodes.urls, node_timeout=0.2)
        for i in (0, 1):
            nodes[i].lose_replies()
        with pytest.raises(QuorumUnavailable, match="1 of 3"):
            rl.acquire("job", ttl=5)
        # the lost calls' writes stood until the failed acquire released them
        nodes.heal()
        assert rl.acquire("job", ttl=5) is not None


def test_a_slow_node_past_the_timeout_is_not_answering():
    with MemoryNodes(3) as nodes:
        rl = Redlock(nodes.urls, node_timeout=0.2)
        nodes[0].slow(0.05)
        assert rl.acquire("fast", ttl=5) is not None
        nodes[0].slow(1.0)
        nodes[1].slow(1.0)
        with pytest.raises(QuorumUnavailable, match="1 of 3"):
            rl.acquire("slow", ttl=5)


@pytest.mark.parametrize("limit", [1, 2], ids=["lock", "permits"])
def test_a_grant_too_late_to_stand_is_no_holder_but_an_outage(limit):
    """A quorum that grants after the lease's validity ran out (a slow first
    connect, a stalled host) leaves nobody holding the name: the attempt is made
    again, and then fails as not answering in time, never as "held by None"
    (which a task's ``drop`` would take for a duplicate)."""
    with MemoryNodes(3) as nodes:
        rl = Redlock(nodes.urls, node_timeout=2.0)
        nodes[0].slow(0.4)
        nodes[1].slow(0.4)
        with pytest.raises(QuorumUnavailable, match="granted too late to stand"):
            rl.try_acquire("late", ttl=0.3, limit=limit)
        left = [key for keys in nodes.keys("*").values() for key in keys]
        assert left and all(":fence:" in key for key in left)  # only the fence values
        nodes.heal()
        assert rl.acquire("late", ttl=5, limit=limit) is not None


def test_a_node_clock_ahead_expires_its_keys_by_it():
    with MemoryNodes(3) as nodes:
        rl = Redlock(nodes.urls, node_timeout=1.0)
        lease = rl.acquire("job", ttl=5)
        assert lease is not None
        nodes[0].clock_offset(10)
        nodes[1].clock_offset(10)
        assert nodes.keys("*:lock:*") == {0: [], 1: [], 2: [lease.key]}
        assert rl.acquire("job", ttl=5) is not None  # two of three saw it expire


@pytest.mark.parametrize(
    "url", ["memory://", "memory://a/b", "memory://a?x=1"], ids=["no-name", "path", "query"]
)
def test_a_bad_memory_url_is_refused_naming_the_form(url):
    with pytest.raises(ConfigurationError, match=r"memory://NAME"):
        node_for(url, 1.0)


def test_without_lupa_a_memory_node_names_the_extra_to_install():
    code = (
        "import sys; sys.modules['lupa'] = None\n"
        "from celery_redlock.core.nodes import node_for\n"
        "node_for('memory://x', 1.0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "pip install 'celery_redlock[memory]'" in done.stderr
