"""The claims' scripts: one-shot claims, the claim on a name's next holder, and
the schedules of coalesced calls (debounce, throttle)."""

from __future__ import annotations

from .shared import Script

__all__ = ["CLAIM", "CLAIM_NEXT", "DEBOUNCE", "THROTTLE"]

# A claim value '~' .. id is the started mark (see GATES): it counts as no claim.
_PENDING = """
local function pending(value)
  if value and string.sub(value, 1, 1) == '~' then return false end
  return value
end
"""

# KEYS[1] claim key; ARGV[1] value, ARGV[2] ttl in ms.
# Returns 1 if the claim is now mine (new, or already mine), 0 if another value holds it.
CLAIM = Script(
    "claim",
    """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then return 1 end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
""",
)

# KEYS[1] claim key; ARGV[1] claimant id, ARGV[2] ttl in ms, ARGV[3] '1' to
# take the claim over from another claimant.
# Returns {1, previous or false, renewed} when the claim names ARGV[1] now
# (renewed = 1 if it already did; its TTL is then raised to ttl, never
# lowered), {0, claimant, pttl_ms} when it names another id. A started mark
# counts as no claim.
CLAIM_NEXT = Script(
    "claim_next",
    _PENDING
    + """
local cur = pending(redis.call('GET', KEYS[1]))
if cur == ARGV[1] then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, false, 1}
end
if cur and ARGV[3] ~= '1' then return {0, cur, redis.call('PTTL', KEYS[1])} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, cur or false, 0}
""",
)

# KEYS[1] claim key, KEYS[2] burst key
# ARGV[1] claimant id, ARGV[2] the client's clock in ms, ARGV[3] delay in ms,
# ARGV[4] longest delay after the burst's first call in ms ('' for none),
# ARGV[5] how long the claim outlives its due time, in ms.
# Debounce: the claim is taken over by ARGV[1], due ARGV[3] after now but no
# later than ARGV[4] after the first call of the burst (the burst began when
# the key had no claim). Returns {1, previous claimant or false, due ms}.
DEBOUNCE = Script(
    "debounce",
    _PENDING
    + """
local now = tonumber(ARGV[2])
local previous = pending(redis.call('GET', KEYS[1]))
local first = previous and tonumber(redis.call('GET', KEYS[2])) or now
local due = now + tonumber(ARGV[3])
if ARGV[4] ~= '' then due = math.max(now, math.min(due, first + tonumber(ARGV[4]))) end
local ttl = due - now + tonumber(ARGV[5])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('SET', KEYS[2], string.format('%d', first), 'PX', ttl)
return {1, previous, string.format('%d', due)}
""",
)

# KEYS[1] claim key (unused: a throttled call's slot is its claim), KEYS[2]
# throttle key: a hash of 'due' and 'id', the latest planned start (ms) and
# the id that runs it, 'pdue' and 'pid', the slot before, and 'start', the
# latest actual start (the acquire writes it).
# ARGV[1] id, ARGV[2] the client's clock in ms, ARGV[3] period in ms,
# ARGV[4] '1' to keep calls that fall inside a period (a trailing run),
# ARGV[5] how long the hash outlives the planned period, in ms.
# Throttle: a call on a quiet key is due now: {2, false, due}. Inside the
# period of the last start (or planned start) it is due at the end of that
# period; if a trailing run is already planned there, it takes that slot
# over: {1, the id it replaced or false, due}. When ARGV[4] is not '1' such a
# call is dropped: {0, the id that holds the period, due}.
THROTTLE = Script(
    "throttle",
    """
local now = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[2], 'due', 'id', 'start')
local planned, owner, started = tonumber(h[1]), h[2], tonumber(h[3])
local due = now
if planned and planned > now then
  due = planned
else
  local base = math.max(planned or -period, started or -period)
  if now < base + period then due = base + period end
end
local slot = string.format('%d', due)
if due > now and ARGV[4] ~= '1' then return {0, owner, slot} end
if planned and planned > now then
  redis.call('HSET', KEYS[2], 'id', ARGV[1])
  return {1, owner, slot}
end
redis.call('HSET', KEYS[2], 'pdue', h[1] or '', 'pid', owner or '', 'due', slot, 'id', ARGV[1])
redis.call('PEXPIRE', KEYS[2], due - now + period + tonumber(ARGV[5]))
if due > now then return {1, false, slot} end
return {2, false, slot}
""",
)
