"""Helpers for the fencing tests: a history checker and the two weakened token
schemes the tests compare against (the grant loop is ``tests/support/recorded_grants.py``).

* :func:`first_non_increase` finds where a history of tokens (in grant order)
  stops growing.
* :func:`one_phase_grant` is the scheme the docstring of ``celery_redlock.redlock``
  warns against: each granting node INCRs a counter inside the acquire and the
  token is the largest increment (no write-back, no time floor).
* :func:`no_time_floor` makes the real client, within a block, leave the clocks out
  of a grant's floor, so only the fence values can make tokens grow.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from celery_redlock.core.nodes import scripts
from celery_redlock.core.nodes.redis.rounds import run_script
from celery_redlock.redlock import Redlock, make_owner

__all__ = [
    "assert_strictly_increasing",
    "first_non_increase",
    "no_time_floor",
    "one_phase_grant",
]


def first_non_increase(tokens: Sequence[int]) -> tuple[int, int, int] | None:
    """``(index, previous, token)`` of the first token not larger than the one before it."""
    for i in range(1, len(tokens)):
        if tokens[i] <= tokens[i - 1]:
            return i, tokens[i - 1], tokens[i]
    return None


def assert_strictly_increasing(tokens: Sequence[int]) -> None:
    bad = first_non_increase(tokens)
    assert bad is None, (
        f"grant #{bad[0]} got token {bad[2]}, not larger than the previous grant's {bad[1]}"
        if bad
        else ""
    )


# -- the one-phase scheme ------------------------------------------------------------

# KEYS[1] lock key, KEYS[2] counter key; ARGV[1] owner, ARGV[2] ttl ms.
# Returns {1, increment} when granted, {0} when another owner holds the key.
ONE_PHASE_ACQUIRE = scripts.Script(
    "one_phase_acquire",
    """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return {0} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, redis.call('INCR', KEYS[2])}
""",
)


def one_phase_grant(rl: Redlock, name: str, ttl: float = 10.0) -> int | None:
    """Acquire ``name`` on ``rl``'s nodes with one-phase tokens, release it, return the token.

    token = the largest per-node INCR among the granting nodes; None when no quorum granted.
    """
    key, _ = rl.keys(name)
    counter = f"{rl.key_prefix}:one-phase-counter:{{{name}}}"
    owner = make_owner()
    replies = run_script(
        (ONE_PHASE_ACQUIRE, (key, counter), (owner, int(ttl * 1000))), rl.nodes, rl.node_timeout
    )
    grants = [int(r[1]) for r in replies if isinstance(r, list) and int(r[0]) == 1]
    run_script((scripts.RELEASE, (key,), (owner,)), rl.nodes, rl.node_timeout)
    return max(grants) if len(grants) >= rl.quorum else None


# -- the real client without its time floor -------------------------------------------


# The real acquire script, but with no clock in the floor: a node without a fence
# value starts from 1, one with a value moves it on by one.
NO_FLOOR_ACQUIRE = scripts.Script(
    "acquire_no_floor",
    scripts.ACQUIRE.text.replace(
        "local function fence_floor()\n",
        "local function fence_floor()\n  if true then return '1' end\n",
    ),
)
assert NO_FLOOR_ACQUIRE.text != scripts.ACQUIRE.text


@contextmanager
def no_time_floor(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside the block, the real client's grants floor fence values at 1 instead of
    the clocks: only the values moved on in phase 1 and written back in phase 2 can make
    tokens grow. The real script is back when the block (or the test) ends."""
    with monkeypatch.context() as patch:
        patch.setattr(scripts, "ACQUIRE", NO_FLOOR_ACQUIRE)
        yield
