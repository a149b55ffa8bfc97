"""A node of every other kind (PostgreSQL, etcd, memory) gives the replies a Redis
node gives: every operation of the lease, the permits, the claims (one-shot, next,
debounce, throttle), the rates' booking phases and inspection, and the plain
commands, run on a real redis-server and on the other node step by step, replies
compared exactly (TTLs within a few hundred ms), and the two stores' contents
compared at the end. Random sequences over a few names,
owners and gate flags, and hand-picked ones for the rules a random walk reaches
rarely. An etcd key lives at least 2 s (its lease's floor), so on etcd the
walks draw no TTL that must run out between two steps."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import pytest

from celery_redlock.core import NodeError, ops
from celery_redlock.core.nodes import command, node_for, perform, scatter, scripts
from celery_redlock.testing.memory import MemoryNodes
from tests.support.kinds import NODE_SETS
from tests.support.pg_nodes import TTL_SLACK, pg_urls, same_reply

pytestmark = pytest.mark.integration

T = 5.0  # a round's timeout: nothing here is about timeouts
SHORT = 25  # ms: a TTL that runs out before the next step (which waits for it)
OWNERS = ["t1|a", "t1|b", "t2|a", "t3|a"]


#: One node of every kind but Redis (tests/support/kinds.py), each held to Redis's replies.
OTHER_KINDS = list(dict.fromkeys(s.kind for s in NODE_SETS if s.kind != "redis"))


@pytest.fixture(scope="module", params=OTHER_KINDS, ids=[f"1{kind}" for kind in OTHER_KINDS])
def other_url(request):
    """The node of the other kind: a throwaway PostgreSQL database, the session's
    etcd cluster, the session's ZooKeeper ensemble, or a memory node of a fresh name."""
    if request.param == "etcd":
        clusters = request.getfixturevalue("etcd_servers_session")
        clusters.flushall()
        yield clusters.urls[0]
        return
    if request.param == "zookeeper":
        ensembles = request.getfixturevalue("zookeeper_servers_session")
        ensembles.flushall()
        yield ensembles.urls[0]
        return
    if request.param == "memory":
        with MemoryNodes(1) as nodes:
            yield nodes.urls[0]
        return
    with pg_urls(1) as urls:
        yield urls[0]


class Both:
    """A Redis node and a node of another kind, sent every step alike."""

    def __init__(self, redis_url: str, other_url: str):
        self.r = node_for(redis_url, T)
        self.p = node_for(other_url, T)
        self.p_ = f"t{uuid.uuid4().hex[:8]}"
        self.steps: list[str] = []
        self.short = False
        #: the longest a step took from its Redis call to the other node's reply (ms):
        #: a TTL set in one step and read in another differs by up to twice that
        self.spread = 0.0
        #: the TTLs a step may draw that run out before the next step: none on etcd
        self.shorts = [] if other_url.startswith("etcd") else [SHORT]

    def close(self) -> None:
        self.r.close()
        self.p.close()

    def k(self, family: str, name: str, *more: str) -> str:
        return ":".join((self.p_, family, name, *more))

    def _check(self, where: str, a: Any, b: Any) -> Any:
        self.steps.append(where)
        assert not isinstance(b, TimeoutError), f"{where}: {b!r}"
        same_reply(a, b, f"step {len(self.steps)}: {where}", TTL_SLACK + 2 * self.spread)
        return a

    def _timed(self, call: Any) -> tuple[Any, Any]:
        """``call(node)`` on the Redis node, then on the other, timing the pair."""
        began = time.monotonic()
        a, b = call(self.r), call(self.p)
        self.spread = max(self.spread, (time.monotonic() - began) * 1000)
        return a, b

    def op(self, op: scripts.Script, keys: list[str], args: list[Any]) -> Any:
        a, b = self._timed(lambda node: scatter((op, keys, args), [node], T)[0])
        return self._check(f"{op.name} {keys} {args}", a, b)

    def cmd(self, *cmd: Any) -> Any:
        a, b = self._timed(lambda node: command([node], cmd, T)[0])
        if cmd[0] == "HGETALL" and isinstance(a, list) and isinstance(b, list):
            a, b = fields(a), fields(b)  # a hash's fields come in no set order
        return self._check(" ".join(map(str, cmd)), a, b)

    def settle(self) -> None:
        """Wait out the short TTLs of the last step on both stores: a store whose clock is
        its own (ZooKeeper's deadlines are set on the ensemble's time, a round trip on)
        may see them run out as late as the slowest pair of calls took."""
        if self.short:
            time.sleep(0.12 + min(self.spread, 1000) / 1000)
            self.short = False

    def scan(self, node: Any, match: str) -> set[bytes]:
        found: set[bytes] = set()
        cursor: Any = b"0"
        while True:
            reply = command([node], ("SCAN", cursor, "MATCH", match, "COUNT", 7), T)[0]
            assert not isinstance(reply, Exception), reply
            cursor, keys = reply
            found.update(keys)
            if int(cursor) == 0:
                return found

    def same_contents(self) -> None:
        """Both stores hold the same keys, values and TTLs under the prefix."""
        match = self.p_ + ":*"
        keys = self.scan(self.r, match)
        assert keys == self.scan(self.p, match)
        for key in sorted(keys):
            kind = self.cmd("TYPE", key)
            if kind == b"string":
                self.cmd("GET", key)
            elif kind == b"hash":
                self.cmd("HGETALL", key)
            elif kind == b"zset":
                self.cmd("ZRANGE", key, 0, -1, "WITHSCORES")
            self.cmd("PTTL", key)


def fields(flat: list) -> list:
    """HGETALL's field, value, field, value... as sorted [field, value] pairs."""
    return sorted([list(pair) for pair in zip(flat[0::2], flat[1::2])])


@pytest.fixture
def both(redis_nodes3, other_url):
    pair = Both(redis_nodes3.urls[0], other_url)
    yield pair
    pair.close()


def now_us() -> str:
    """The client's clock for a grant's fence floor, a second ahead: a grant takes
    at least max(this plus a second, the server's clock), and the two calls of a
    step (Redis's, then the other node's) read two clocks, apart by the step's
    time on a loaded host; this far ahead, the floor is this on both."""
    return str(time.time_ns() // 1000 + 1_000_000)


# -- a random walk ----------------------------------------------------------------


def ttl(rng: random.Random, both: Both) -> int:
    value = rng.choice([60000, 60000, 30000, *both.shorts])
    both.short |= value == SHORT
    return value


def permit_keys(both: Both, name: str, gated: bool, task: str) -> list[str]:
    lock = both.k("lock", name)
    extra = [both.k("receipt", name, task), both.k("claim", name), both.k("throttle", name)]
    return [lock, both.k("fence", name), *(extra if gated else [lock] * 3)] + [
        f"{lock}#{i}" for i in (1, 2)
    ]


def gate_args(rng: random.Random, both: Both, task: str) -> list[Any]:
    flags = "".join(rng.sample("rcswt", rng.randint(0, 3)))
    period = rng.choice(["1", "600000"]) if "t" in flags else "2000"
    both.short |= period == "1"
    return [task, flags, period, time.time_ns() // 1_000_000, ""]


def step(rng: random.Random, both: Both) -> None:
    name, other = rng.sample(["n1", "n2"], 2)
    owner = rng.choice(OWNERS)
    task = owner.split("|")[0]
    lock, fence = both.k("lock", name), both.k("fence", name)
    fencing = rng.choice(["", "600000"])
    what = rng.randrange(19)
    if what >= 15:
        claim_step(rng, both, name, task, what)
        both.settle()
        return
    if what == 0:
        both.op(scripts.ACQUIRE, [lock, fence], [owner, ttl(rng, both), fencing, now_us()])
    elif what == 1:
        keys = [lock, fence, both.k("receipt", name, task), both.k("claim", name)]
        keys.append(both.k("throttle", name))
        args = [owner, ttl(rng, both), fencing, now_us(), *gate_args(rng, both, task)]
        both.op(scripts.ACQUIRE, keys, args)
    elif what in (2, 3):
        gated = rng.random() < 0.4
        keys = permit_keys(both, name, gated, task)
        gates = gate_args(rng, both, task) if gated else ["", "", "", "", ""]
        args = [owner, ttl(rng, both), fencing, now_us(), *gates, rng.choice(["", "0", "1", "2"])]
        if what == 3:  # another name's permit with it
            args[5] += "a"
            args += [3, 3, rng.choice(["", "0", "2"])]
            keys += [both.k("fence", other), *permit_keys(both, other, False, task)[5:]]
            keys.insert(-2, both.k("lock", other))
        both.op(scripts.ACQUIRE_PERMIT, keys, args)
    elif what == 4:
        o2 = rng.choice(OWNERS)
        args = [owner, ttl(rng, both), o2, ttl(rng, both)]
        both.op(scripts.EXTEND, [lock, both.k("lock", other)], args)
    elif what == 5:
        keys = [lock, both.k("receipt", name, task), both.k("claim", name)]
        args = [owner, rng.choice(["", "60000"]), rng.choice(["", task])]
        both.op(scripts.RELEASE, keys, args)
    elif what == 6:
        keys = [lock, f"{lock}#1", f"{lock}#2"]
        both.op(scripts.RELEASE_PREFIX, keys, [rng.choice(["t1|", "t2|", "t1|a", "t"])])
    elif what == 7:
        have = both.cmd("GET", fence)
        base = int(have) if have is not None and have.isdigit() else 10**15
        token = str(base + rng.choice([-1, 0, 0, 1, 10**6]))
        args = [owner, token, rng.choice(["600000", *map(str, both.shorts)]), rng.choice(["", "s"])]
        both.short |= args[2] == str(SHORT)
        both.op(scripts.FENCE, [lock, fence], args)
    elif what == 8:
        both.op(scripts.ISSUE, [lock, fence], [owner, "", rng.choice(["600000"]), now_us()])
    elif what == 9:
        both.op(scripts.INSPECT, [rng.choice([lock, f"{lock}#1"]), fence], [])
    elif what == 10:
        key = rng.choice([lock, fence, both.k("claim", name), both.k("throttle", name)])
        both.op(scripts.PEEK, [key], [])
    elif what == 11:
        claim = rng.choice([task, "~" + task, "t9"])
        both.cmd("SET", both.k("claim", name), claim, "NX", "PX", ttl(rng, both))
    else:
        key = rng.choice(
            [lock, fence, f"{lock}#1", both.k("claim", name), both.k("throttle", name)]
            + [both.k("receipt", name, t) for t in ("t1", "t2")]
        )
        verb = rng.choice(["GET", "PTTL", "TYPE", "DEL", "HGETALL", "ZRANGE"])
        if verb == "ZRANGE":
            both.cmd(verb, key, 0, -1, "WITHSCORES")
        else:
            both.cmd(verb, key)
    both.settle()


def claim_step(rng: random.Random, both: Both, name: str, task: str, what: int) -> None:
    """A step of the claims: a one-shot claim, the next holder's, a debounce, a throttle."""
    claim = both.k("claim", name)
    now_ms = time.time_ns() // 1_000_000  # one client clock, sent to both
    if what == 15:
        both.op(scripts.CLAIM, [claim], [rng.choice([task, "t9", "~" + task]), ttl(rng, both)])
    elif what == 16:
        both.op(scripts.CLAIM_NEXT, [claim], [task, ttl(rng, both), rng.choice(["", "1"])])
    elif what == 17:
        delay = rng.choice([*both.shorts, 2000])
        args = [task, now_ms, delay, rng.choice(["", "3000", *map(str, both.shorts)]), 5000]
        both.short |= delay == SHORT
        both.op(scripts.DEBOUNCE, [claim, both.k("burst", name)], args)
    else:
        period = rng.choice([*both.shorts, 3000])
        both.short |= period == SHORT
        args = [task, now_ms, period, rng.choice(["1", ""]), rng.choice([*both.shorts, 5000])]
        both.op(scripts.THROTTLE, [claim, both.k("throttle", name)], args)


@pytest.mark.parametrize("seed", range(4))
def test_a_random_walk_gets_the_replies_redis_gives(both, seed):
    rng = random.Random(seed)
    for _ in range(150):
        step(rng, both)
    both.same_contents()


# -- hand-picked ------------------------------------------------------------------


def test_acquire_extend_release_and_the_fence(both):
    lock, fence = both.k("lock", "a"), both.k("fence", "a")
    first = both.op(scripts.ACQUIRE, [lock, fence], ["t1|a", 10000, "600000", now_us()])
    assert first[0] == 1
    again = both.op(scripts.ACQUIRE, [lock, fence], ["t1|a", 10000, "600000", now_us()])
    assert again == first  # a re-sent acquire returns the value its first send wrote
    held = both.op(scripts.ACQUIRE, [lock, fence], ["t2|a", 10000, "600000", now_us()])
    assert held[:2] == [0, b"t1|a"] and held[3] is None
    assert both.op(scripts.EXTEND, [lock, lock], ["t1|a", 20000, "t2|a", 5]) == [1, 0]
    assert both.op(scripts.ISSUE, [lock, fence], ["t2|a", "", "600000", now_us()]) is None
    issued = both.op(scripts.ISSUE, [lock, fence], ["t1|a", "", "600000", now_us()])
    assert int(issued) > int(first[1])
    # fence: a larger token lands, an equal one too unless strict, a smaller one never
    big = str(int(issued) + 5)
    assert both.op(scripts.FENCE, [lock, fence], ["t1|a", big, "600000"]) == 1
    assert both.op(scripts.FENCE, [lock, fence], ["t1|a", big, "600000"]) == 1
    assert both.op(scripts.FENCE, [lock, fence], ["t1|a", big, "600000", "s"]) == 0
    assert both.op(scripts.FENCE, [lock, fence], ["t1|a", issued, "600000"]) == 0
    assert both.op(scripts.RELEASE, [lock], ["t2|a"]) == 0
    assert both.op(scripts.RELEASE, [lock], ["t1|a"]) == 1
    assert both.op(scripts.INSPECT, [lock, fence], [])[:2] == [None, -2]
    both.same_contents()


def test_a_grant_takes_the_fence_moved_on_or_the_clocks_whichever_is_larger(both):
    # a value past every clock carries, digit by digit
    lock, fence = both.k("lock", "b"), both.k("fence", "b")
    both.cmd("SET", fence, "99999999999999999999", "NX", "PX", 60000)
    got = both.op(scripts.ACQUIRE, [lock, fence], ["o", 5000, "60000", "0"])
    assert got == [1, b"100000000000000000000"]
    # a small value (a restored fence): the client's clock a second on, when it is ahead
    lock2, fence2 = both.k("lock", "c"), both.k("fence", "c")
    both.cmd("SET", fence2, "999", "NX", "PX", 60000)
    future = (int(time.time()) + 3600) * 10**6
    got = both.op(scripts.ACQUIRE, [lock2, fence2], ["o", 5000, "60000", str(future)])
    assert got == [1, str(future + 10**6).encode()]
    # the client's clock at 0: each node's own clock, in whole microseconds
    for name, node in (("d", both.r), ("e", both.p)):
        lock3, fence3 = both.k("lock", name), both.k("fence", name)
        command([node], ("SET", fence3, "999", "PX", 60000), T)
        before = time.time_ns() // 1000
        reply = scatter((scripts.ACQUIRE, [lock3, fence3], ["o", 5000, "60000", "0"]), [node], T)[0]
        # a clock the kind estimates (ZooKeeper's, from a znode's mtime and a round
        # trip) may read a little late: never early, and never a second on
        assert before <= int(reply[1]) <= time.time_ns() // 1000 + 100_000
        again = scatter((scripts.ACQUIRE, [lock3, fence3], ["o", 5000, "60000", "0"]), [node], T)[0]
        assert again == reply  # a re-sent acquire keeps its value, clock or not
        command([node], ("DEL", lock3, fence3), T)


def test_permits_fill_then_name_the_holder_that_frees_first(both):
    keys = permit_keys(both, "p", False, "")
    none = ["", "", "", "", ""]
    got = [
        both.op(scripts.ACQUIRE_PERMIT, keys, [o, t, "600000", now_us(), *none, "1"])
        for o, t in (("t1|a", 30000), ("t2|a", 10000), ("t3|a", 20000))
    ]
    assert [g[0] for g in got] == [1, 1, 1] and [g[2] for g in got] == [1, 0, 2]
    full = both.op(scripts.ACQUIRE_PERMIT, keys, ["t4|a", 5000, "", now_us(), *none, ""])
    assert full[:2] == [0, b"t2|a"] and full[3] is None
    # another copy of a task id stops the grant as if every permit were held
    copy = both.op(scripts.ACQUIRE_PERMIT, keys, ["t1|b", 5000, "", now_us(), "t1", *none[1:]])
    assert copy[:2] == [0, b"t1|a"]
    assert both.op(scripts.RELEASE_PREFIX, keys[5:] + keys[:1], ["t2|"]) == 1
    # all or nothing across names: the other name is full
    other = permit_keys(both, "q", False, "")
    # a second apart, so the one that frees first is plain on every kind (ZooKeeper's
    # deadlines are exact to a round trip, not to a millisecond)
    for o, ttl_ms in (("x|1", 60000), ("x|2", 61000), ("x|3", 62000)):
        both.op(scripts.ACQUIRE_PERMIT, other, [o, ttl_ms, "", now_us(), *none, ""])
    both_names = keys + [other[1], other[0], *other[5:]]
    args = ["t5|a", 5000, "600000", now_us(), "", "a", "", "", "", "", 3, 3, ""]
    assert both.op(scripts.ACQUIRE_PERMIT, both_names, args)[:2] == [5, 1]
    both.op(scripts.RELEASE_PREFIX, other[5:] + other[:1], ["x|"])
    granted = both.op(scripts.ACQUIRE_PERMIT, both_names, args)
    assert granted[0] == 1 and len(granted) == 5
    both.same_contents()


def test_the_gates(both):
    lock, fence = both.k("lock", "g"), both.k("fence", "g")
    receipt, claim, throttle = both.k("rc", "g", "t1"), both.k("claim", "g"), both.k("thr", "g")
    keys = [lock, fence, receipt, claim, throttle]

    def acquire(owner: str, flags: str, period: str = "", now: int = 0) -> Any:
        args = [owner, 10000, "600000", now_us(), owner.split("|")[0], flags]
        if period:
            args += [period, now]
        return both.op(scripts.ACQUIRE, keys, args)

    both.cmd("SET", claim, "t2", "NX", "PX", 30000)
    assert acquire("t1|a", "c")[:2] == [3, b"t2"]  # claimed by another id
    assert acquire("t2|a", "cw")[0] == 1  # its claimant takes it and withdraws the claim
    assert both.cmd("GET", claim) == b"~t2"
    both.op(scripts.RELEASE, [lock, receipt, claim], ["t2|a", "60000", "t2"])
    assert acquire("t1|a", "r") == [2]  # the receipt written at release: t1 finished
    assert acquire("t1|a", "c")[0] == 1  # a started mark counts as no claim ...
    both.op(scripts.RELEASE, [lock], ["t1|a"])
    assert acquire("t3|a", "cs")[:2] == [3, b"~t2"]  # ... but for one claimed at publish
    now = time.time_ns() // 1_000_000
    assert acquire("t3|a", "t", "5000", now)[0] == 1
    both.op(scripts.RELEASE, [lock], ["t3|a"])
    assert acquire("t3|a", "t", "5000", now + 1000) == [4, 4000]
    assert acquire("t3|a", "t", "5000", now + 6000)[0] == 1
    both.same_contents()


def test_errors_and_plain_commands(both):
    thr = both.k("thr", "e")
    lock = both.k("lock", "e")
    keys = [lock, both.k("fence", "e"), both.k("rc", "e"), both.k("cl", "e"), thr]
    both.op(scripts.ACQUIRE, keys, ["t1|a", 5000, "", now_us(), "t1", "t", "60000", 1, ""])
    assert both.cmd("TYPE", thr) == b"hash"
    assert both.cmd("HGETALL", thr) == [[b"start", b"1"]]
    assert isinstance(both.cmd("GET", thr), Exception)  # WRONGTYPE on both
    assert isinstance(both.op(scripts.INSPECT, [thr, lock], []), Exception)
    assert both.cmd("ZRANGE", both.k("none", "e"), 0, -1, "WITHSCORES") == []
    assert both.cmd("SET", lock, "x", "NX", "PX", 100) is None
    assert both.cmd("DEL", lock, thr, both.k("none", "e")) == 2
    assert both.cmd("PTTL", lock) == -2 and both.cmd("TYPE", lock) == b"none"
    assert both.cmd("PING") == b"PONG"
    odd = both.k("o", "a*b?[c]\\x")
    both.cmd("SET", odd, "1", "NX", "PX", 60000)
    both.cmd("SET", both.k("o", "aXb"), "1", "NX", "PX", 60000)
    pattern = both.p_ + ":o:a\\*b\\?\\[c]\\\\*"
    assert both.scan(both.r, pattern) == both.scan(both.p, pattern) == {odd.encode()}
    pattern = both.p_ + ":o:a[*X]b*"
    assert len(both.scan(both.r, pattern)) == len(both.scan(both.p, pattern)) == 2
    assert isinstance(command([both.p], ("INCR", lock), T)[0], Exception)


def test_typed_reads_give_the_results_redis_gives(both):
    """The plain reads the tools send as typed operations (a key's type, its TTL,
    its value by type) answer alike on every kind."""
    lock, thr, none = both.k("lock", "r"), both.k("thr", "r"), both.k("none", "r")
    keys = [lock, both.k("fence", "r"), both.k("rc", "r"), both.k("cl", "r"), thr]
    both.op(scripts.ACQUIRE, keys, ["t1|a", 60000, "", now_us(), "t1", "t", "60000", 1, ""])

    def read(op: Any) -> Any:
        a, b = both._timed(lambda node: perform(op, [node], T)[0])
        both.steps.append(repr(op))
        alike = isinstance(a, NodeError) and isinstance(b, NodeError) or type(a) is type(b)
        assert alike, f"{op!r}: {a!r} on Redis, {b!r} on the other"
        return a, b

    for key, kind in ((lock, "string"), (thr, "hash"), (none, "none")):
        assert read(ops.ReadType(key)) == (ops.KeyType(kind), ops.KeyType(kind))
    (a, b) = read(ops.ReadTtl(lock))
    assert abs(a.pttl_ms - b.pttl_ms) <= TTL_SLACK + 2 * both.spread and a.pttl_ms > 0
    assert read(ops.ReadTtl(none)) == (ops.Remaining(-2), ops.Remaining(-2))
    assert read(ops.Get(lock)) == (ops.Value("t1|a"), ops.Value("t1|a"))
    assert read(ops.ReadHash(thr)) == (ops.Fields((("start", "1"),)),) * 2
    assert read(ops.ReadScores(none)) == (ops.Scores(()), ops.Scores(()))
    wrong = read(ops.Get(thr))  # WRONGTYPE on both: the node's error, as the core's
    assert all(isinstance(error, NodeError) for error in wrong), wrong


def test_ttls_run_out_alike(both):
    if not both.shorts:
        pytest.skip("a TTL of 25 ms: an etcd key lives at least 2 s (its lease's floor)")
    lock, fence = both.k("lock", "x"), both.k("fence", "x")
    both.op(scripts.ACQUIRE, [lock, fence], ["t1|a", SHORT, str(SHORT), now_us()])
    time.sleep(0.12)
    assert both.op(scripts.INSPECT, [lock, fence], []) == [None, -2, None]
    both.op(scripts.ACQUIRE, [lock, fence], ["t1|a", 60000, "", now_us()])
    left = both.op(scripts.PEEK, [lock], [])[1]
    assert 60000 - TTL_SLACK < left <= 60000


# -- rates: the booking phases ------------------------------------------------------


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def windows(rng: random.Random) -> list[Any]:
    """A key's windows as the rate round sends them: count, then field, T, tau,
    period, N (0: paced; else counted, in the key's log)."""
    # A window's period only sets the hash's TTL here: an hour, so the walk's clock
    # (run ahead of the servers') never makes a TTL that ends between two calls.
    shapes = [
        ("s", 100, 0, 3_600_000, 0),
        ("s", 100, 200, 3_600_000, 0),
        ("h", 7200, 0, 3_600_000, 0),
        ("c", 0, 0, 3_600_000, 3),
    ]
    chosen = rng.sample(shapes, rng.randint(1, 2))
    return [str(len(chosen))] + [str(x) for w in chosen for x in w]


@pytest.mark.parametrize("seed", range(3))
def test_rate_bookings_give_the_replies_redis_gives(both, seed):
    """Phase 1 (book), phase 2 (compare-and-set at s*) and undo, on one or two keys
    at a time, paced and counted windows, with fresh and stale versions: the same
    replies, hashes and logs."""
    rng = random.Random(seed)
    names = [both.k("rate", "r1"), both.k("rate", "r2")]
    logs = {names[0]: both.k("booked", "r1"), names[1]: both.k("booked", "r2")}
    shape = {name: windows(rng) for name in names}
    booked: dict[tuple, list] = {}  # keys -> the last phase 1 reply for them
    now = time.time_ns() // 1_000_000
    for _ in range(120):
        now += rng.choice([0, 0, 30, 100, 700])
        keys = rng.sample(names, rng.randint(1, 2))
        last = booked.get(tuple(keys))
        phase = rng.choice(["1", "1", "2", "0"]) if last else "1"
        if phase == "1":
            third = rng.choice(["", "", str(now + rng.choice([-50, 0, 400]))])
        elif phase == "2":
            third = str(int(last[1]) + rng.choice([0, 0, 50, -50]))
        else:
            at = rng.choice(["-", text(last[1])])  # out of the logs, or where it stood
            third = " ".join([at, *(text(x) for x in last[2 + len(keys) :])])
        args: list[Any] = [phase, str(now), third]
        for i, key in enumerate(keys):
            version = last[2 + i] if last and phase != "1" else b""
            if last and phase != "1" and rng.random() < 0.2:
                version = b"9999"  # a stale version: a booking came in between
            args += [text(version), *shape[key]]
        reply = both.op(scripts.RATE, [*keys, *(logs[key] for key in keys)], args)
        if phase == "1" and isinstance(reply, list) and reply[0] == 1:
            booked[tuple(keys)] = reply
    both.same_contents()


def test_queues_park_in_order_and_hand_over_as_redis_does(both):
    """queue_park: tickets in order, a re-park keeps its place, a full queue, a ticket
    raised by the write-back; queue_next: a pending hand-over, held keys (a holder
    handing over counts as free), an empty queue, the head claimed, a take-out."""
    claim, queue, calls = both.k("claim", "q"), both.k("queue", "q"), both.k("qcalls", "q")
    lock, permit = both.k("lock", "q"), both.k("permit", "q", "1")

    def park(id: str, most: int = 3, floor: str = "") -> Any:
        return both.op(scripts.QUEUE_PARK, [queue, calls], [id, f"call-{id}", most, 60000, floor])

    def next_(drop: str = "", owner: str = "", ttl: str = "30000", *locks: str) -> Any:
        keys = [claim, queue, calls, *(locks or (lock,))]
        return both.op(scripts.QUEUE_NEXT, keys, [drop, owner, ttl, 60000])

    assert park("a") == [1, 1, b"1"] and park("b") == [1, 2, b"2"]
    assert park("a") == [1, 1, b"1"]  # re-sent: keeps its place
    assert park("c", floor="7") == [1, 3, b"7"]  # the agreed ticket written back
    assert park("d") == [0, 3]  # full
    peek = both.op(scripts.QUEUE_PEEK, [queue, calls], [])
    assert peek == [3, b"a", b"call-a", b"1"]
    assert park("d", most=0) == [1, 4, b"8"]  # the last ticket never goes back
    both.cmd("SET", lock, "t1|a", "NX", "PX", 30000)
    assert next_() == [0, 1, 1]  # held
    assert next_("", "t1|a") == [0, 3, b"a", b"call-a", b"1", 4]  # its holder hands over
    assert next_()[:3] == [0, 0, b"a"]  # a hand-over is pending
    both.cmd("DEL", claim, lock)
    both.cmd("SET", claim, "~a", "NX", "PX", 30000)  # a started: its mark is no claim
    assert next_("a")[:4] == [1, 3, b"b", b"call-b"]
    assert next_("zz", "", "") == [0, 4]  # take out only
    both.cmd("DEL", claim)
    both.cmd("SET", lock, "t2|a", "NX", "PX", 30000)
    assert next_("", "", "30000", lock, permit)[:3] == [0, 3, b"b"]  # one permit of two free
    both.cmd("SET", permit, "t3|a", "NX", "PX", 30000)
    both.cmd("DEL", claim)
    assert next_("", "", "30000", lock, permit) == [0, 1, 2]
    for id in ("b", "c", "d"):
        next_(id, "", "")
    both.cmd("DEL", claim, lock, permit)
    assert next_() == [0, 2]  # nobody waits
    both.cmd("SET", lock, "t4|a", "NX", "PX", 30000)
    assert next_() == [0, 2]  # nobody waits, whoever holds the key
    assert both.op(scripts.QUEUE_PEEK, [queue, calls], []) == [0, None, None, None]
    # supersede: the newest park takes every other waiting id out, and names them
    park("e", most=0)
    park("f", most=0)
    newest = both.op(scripts.QUEUE_PARK, [queue, calls], ["g", "call-g", 0, 60000, "", "1"])
    assert newest[:2] == [1, 1] and sorted(newest[3:]) == [b"e", b"f"]
    assert both.op(scripts.QUEUE_PEEK, [queue, calls], [])[:2] == [1, b"g"]
    both.same_contents()
