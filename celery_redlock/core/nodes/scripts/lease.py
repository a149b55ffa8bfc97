"""The lease's scripts: acquire a name's lock key, write its fence, renew, release."""

from __future__ import annotations

from .shared import ADVANCE, GATES, GREATER, OWNS, SUCCESSOR, Script

__all__ = ["ACQUIRE", "EXTEND", "FENCE", "ISSUE", "RELEASE", "RELEASE_PREFIX"]

# KEYS[1] lock key, KEYS[2] fence key; with ARGV[5]: KEYS[3] receipt key,
# KEYS[4] claim key, KEYS[5] throttle key (see GATES for ARGV[5..9]).
# ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] fence retention in ms ('' with
# fencing off), ARGV[4] the client's clock in microseconds (decimal).
# Returns a gate's reply ({2} receipt, {3, claimant, pttl_ms} claimed by
# another id, {4, wait_ms} throttled); {0, holder, pttl_ms, claimant or false}
# when another owner holds the key. Otherwise the key is set (or, already
# mine, its TTL refreshed: a re-sent acquire is harmless) and it returns {1}
# with fencing off, else {1, fence}: the node's fence value, moved on by this
# grant, floored by the clocks (ADVANCE). A re-sent acquire returns the value
# its first send wrote. Without ARGV[5] no gate applies: the common case takes
# the key with one SET NX, reads it only when that fails, and returns before
# the gates are even defined.
ACQUIRE = Script(
    "acquire",
    GREATER
    + SUCCESSOR
    + ADVANCE
    + """
if not ARGV[5] then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if ARGV[3] == '' then return {1} end
    return {1, advance(KEYS[2], false)}
  end
  local mine = redis.call('GET', KEYS[1])
  if mine ~= ARGV[1] then return {0, mine, redis.call('PTTL', KEYS[1]), false} end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if ARGV[3] == '' then return {1} end
  return {1, advance(KEYS[2], mine)}
end
"""
    + GATES
    + """
local stop = gate_enter()
if stop then return stop end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return {0, holder, redis.call('PTTL', KEYS[1]), claim}
end
stop = gate_free()
if stop then return stop end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
gate_granted()
if ARGV[3] == '' then return {1} end
return {1, advance(KEYS[2], holder)}
""",
)

# KEYS[1] lock key, KEYS[2] fence key; ARGV[1], ARGV[3] and ARGV[4] as ACQUIRE
# (ARGV[2] is not read). The first read of a lazy lease's token: where the
# node still holds my owner value, its fence value is moved on (and floored) as
# a grant moves it, and returned; elsewhere nil.
ISSUE = Script(
    "issue",
    GREATER
    + SUCCESSOR
    + ADVANCE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
return advance(KEYS[2], false)
""",
)

# KEYS[1] lock key, KEYS[2] fence key
# ARGV[1] owner, ARGV[2] token (decimal string), ARGV[3] fence retention in ms,
# optional ARGV[4] 's' (strict, for permits): a node that already records the
# token refuses it too, so no two holders can both land one value on a quorum.
# Returns 1 when this node now records the token (or already did), 0 when
# the node no longer holds my owner value or records a larger token.
FENCE = Script(
    "fence",
    GREATER
    + OWNS
    + """
if not owns(KEYS[1], ARGV[1]) then return 0 end
local fence = redis.call('GET', KEYS[2])
if fence and not greater(ARGV[2], fence) and (fence ~= ARGV[2] or ARGV[4] == 's') then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
""",
)

# KEYS lock keys; ARGV[2i-1] the owner expected at KEYS[i], ARGV[2i] its ttl in ms
# Returns a list: 1 where the key held its owner and its TTL was set to ttl
# (set, never added), 0 elsewhere. One call renews every lease held on a node.
EXTEND = Script(
    "extend",
    OWNS
    + """
local out = {}
for i, key in ipairs(KEYS) do
  if owns(key, ARGV[2 * i - 1]) then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
""",
)

# KEYS[1] lock key; ARGV[1] owner. Returns 1 if deleted, 0 if not mine.
# Optional, in the same call: KEYS[2] receipt key, ARGV[2] its ttl in ms ('' for
# none) records that the owner's id finished; KEYS[3] claim key, ARGV[3] an id:
# the claim is withdrawn if it names that id, leaving the started mark
# '~' .. ARGV[3] for the rest of its TTL (no claim for anyone but a message it
# replaced, which learns so; see GATES).
RELEASE = Script(
    "release",
    OWNS
    + """
local out = 0
if owns(KEYS[1], ARGV[1]) then out = redis.call('DEL', KEYS[1]) end
if ARGV[2] and ARGV[2] ~= '' then redis.call('SET', KEYS[2], '1', 'PX', ARGV[2]) end
if ARGV[3] and ARGV[3] ~= '' and owns(KEYS[3], ARGV[3]) then
  local left = redis.call('PTTL', KEYS[3])
  if left > 0 then
    redis.call('SET', KEYS[3], '~' .. ARGV[3], 'PX', left)
  else
    redis.call('DEL', KEYS[3])
  end
end
return out
""",
)

# KEYS lock keys (a name's lock key, or its K permit keys); ARGV[1] owner
# prefix (task id and separator, or a whole owner value).
# Deletes each key whose owner value starts with the prefix, so a parent
# process can free the lock (or permit, whatever its index) of a child that
# died without knowing its random part. Returns how many keys it deleted.
RELEASE_PREFIX = Script(
    "release_prefix",
    """
local out = 0
for _, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if holder and string.sub(holder, 1, #ARGV[1]) == ARGV[1] then
    out = out + redis.call('DEL', key)
  end
end
return out
""",
)
