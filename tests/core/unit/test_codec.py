"""The codec under the node seam: operation values packed as the scripts' KEYS and
ARGV (the wire of the previous release, to the letter), and Lua-shaped replies read
back as typed results."""

from __future__ import annotations

from celery_redlock.core import ConfigurationError, NodeError, ops
from celery_redlock.core.nodes import NotReplicated, codec, scripts


def test_a_gated_throttled_acquire_packs_as_before():
    gates = ops.Gates(
        "t1", "rk", "ck", receipts=True, claim="take", own_claim=True,
        throttle_ms=500, throttle_key="tk", now_ms=7, slot="s",
    )  # fmt: skip
    script, keys, args = codec.encode(ops.Acquire("k", "f", "o", 1000, "60000", 5, gates))
    assert script is scripts.ACQUIRE
    assert keys == ("k", "f", "rk", "ck", "tk")
    assert args == ("o", 1000, "60000", 5, "t1", "rcwst", 500, 7, "s")
    plain = codec.encode(ops.Acquire("k", "f", "o", 1000, "", 5))
    assert plain[1:] == (("k", "f"), ("o", 1000, "", 5))


def test_permits_held_together_pack_counts_and_preferred_indexes():
    op = ops.AcquirePermit(
        (("a0", "a1"), ("b0", "b1", "b2")), ("fa", "fb"), "o", 1000, "", 5, None, None, ("1", "")
    )
    script, keys, args = codec.encode(op)
    assert script is scripts.ACQUIRE_PERMIT
    assert keys == ["a0", "fa", "a0", "a0", "a0", "a1", "fb", "b0", "b1", "b2"]
    assert args == ["o", 1000, "", 5, "", "a", "", "", "", "1", 2, 3, ""]


def test_replies_decode_to_results():
    acquire = ops.Acquire("k", "f", "o", 1000, "", 5)
    assert codec.decode(acquire, [1, b"42"]) == ops.Granted("42")
    assert codec.decode(acquire, [0, b"x", 900, False]) == ops.Held("x", 900, None)
    assert codec.decode(acquire, [3, b"t2", 80]) == ops.Claimed("t2", 80)
    assert codec.decode(acquire, [4, 250]) == ops.TooEarly(250)
    assert codec.decode(acquire, [2]) == ops.Finished()
    permit = ops.AcquirePermit((("a0",),), ("fa",), "o", 1000, "", 5, None)
    assert codec.decode(permit, [1, b"9", 2, b"3", 0]) == ops.GrantedPermit("9", 2, (("3", 0),))
    assert codec.decode(permit, [5, 1, b"y", 70]) == ops.Full(1, "y", 70)
    nxt = ops.QueueNext("c", "q", "qc", ("k",), "", "", "100", 1000)
    assert codec.decode(nxt, [1, 3, b"id", b"call", b"4", 2]) == ops.Handed(
        True, "id", "call", "4", 2
    )
    assert codec.decode(nxt, [0, 2]) == ops.Empty(False)


def test_a_round_decodes_once_and_keeps_errors():
    release = ops.Release("k", "o")
    lost = TimeoutError("no reply")
    unconfirmed = NotReplicated("1 of 2 replicas", 1)
    got = codec.decode_all(release, [1, lost, unconfirmed, 0], NotReplicated)
    assert got[0] == ops.Count(1) and got[3] == ops.Count(0)
    # a kind's own error reaches the core as a NodeError of its text, raised from it
    assert isinstance(got[1], NodeError) and got[1].__cause__ is lost
    assert str(got[1]) == "no reply" and got[1].heals
    assert got[2] is unconfirmed and unconfirmed.reply == ops.Count(1)
    strange = codec.decode_all(
        ops.Acquire("k", "f", "o", 1, "", 5), [[1, b"7"], "?"], NotReplicated
    )
    assert strange[0] == ops.Granted("7") and isinstance(strange[1], ValueError)


def test_the_core_errors_stay_and_each_reply_alone_wraps_a_kinds_error():
    refused = NodeError("n: password refused", "n", heals=False)
    misconfigured = ConfigurationError("n: no such schema")
    lost = ConnectionError("")
    got = codec.decode_each(ops.Get("k"), [refused, misconfigured, lost, b"v"])
    assert got[0] is refused and got[1] is misconfigured and got[3] == ops.Value("v")
    assert isinstance(got[2], NodeError) and str(got[2]) == "ConnectionError"


def test_a_plain_read_is_a_command_and_its_reply_a_value():
    assert codec.encode(ops.Get("k")) == (None, ("GET", "k"), ())
    page = codec.decode(ops.Scan("0", "p:*", 100), [b"17", [b"p:a", b"p:b"]])
    assert page == ops.Page("17", ("p:a", "p:b"))
    assert codec.decode(ops.ReadScores("z"), [b"m", b"1.5"]) == ops.Scores((("m", 1.5),))
    assert codec.decode(ops.ReadHash("h"), {b"f": b"9"}) == ops.Fields((("f", "9"),))
    assert codec.encode(ops.ReadType("k")) == (None, ("TYPE", "k"), ())
    assert codec.encode(ops.ReadTtl("k")) == (None, ("PTTL", "k"), ())
    assert codec.decode(ops.ReadType("k"), b"zset") == ops.KeyType("zset")
    assert codec.decode(ops.ReadTtl("k"), -2) == ops.Remaining(-2)
