"""The rate reservation: GCRA per window, booked in two phases (see :mod:`..rates`).

None of the helpers of :mod:`.shared` applies: a rate hash holds instants, not
tokens or owners, and numbers in ms stay far below 2**53.
"""

from __future__ import annotations

from .lease import ACQUIRE
from .permits import ACQUIRE_PERMIT
from .shared import Script

__all__ = ["ACQUIRE_PERMIT_RATED", "ACQUIRE_RATED", "RATE", "UNSTART", "rated"]

# KEYS the rate hashes of the keys booked together.
# ARGV[1] '1' (phase 1: book the first admitted instant), '2' (phase 2:
# compare-and-set) or '0' (undo phase 1); ARGV[2] the client's clock in ms;
# ARGV[3] s* in ms (phase 2), the TATs before phase 1 (undo: one per window
# in order, '-' where there was none, separated by spaces), or in phase 1 ''
# or the instant (ms) before which it books nothing: then an earlier first
# admitted instant s is answered {2, s} and nothing changes; then per
# key: the version phase 1 answered (phases 2 and 0) or '', the count m of its
# windows, then m times: field, T ms, tau ms, period ms.
# Phase 1 returns {1, s, v_1, ..., v_k, tat_1, ...}: the instant booked, each
# hash's new version, and each window's TAT before (or '-'). Phase 2 returns
# {1} when every hash still had the version given, and then moves this node's
# last booking from its own instant to s*; or, a booking came in between,
# when GCRA admits s* here, booked anew beside it; else {0}. Undo returns {1}
# when every hash still had the version given, and then puts the TATs back as
# they were before phase 1 (the booking is gone); else {0}: a booking came
# after mine, which stays.
RATE = Script(
    "rate",
    """
local phase, now = ARGV[1], tonumber(ARGV[2])
local keys, a = {}, 4
for i, key in ipairs(KEYS) do
  local k = {key = key, version = ARGV[a], windows = {}}
  local m = tonumber(ARGV[a + 1])
  a = a + 2
  for j = 1, m do
    k.windows[j] = {ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])}
    a = a + 4
  end
  keys[i] = k
end
local function tat(key, field) return tonumber(redis.call('HGET', key, field) or '0') end
if phase == '0' then
  for _, k in ipairs(keys) do
    if (redis.call('HGET', k.key, 'v') or '') ~= k.version then return {0} end
  end
  local before = string.gmatch(ARGV[3], '%S+')
  for _, k in ipairs(keys) do
    for _, w in ipairs(k.windows) do
      local t = before()
      if t == nil or t == '-' then
        redis.call('HDEL', k.key, w[1])
      else
        redis.call('HSET', k.key, w[1], t)
      end
    end
    redis.call('HINCRBY', k.key, 'v', 1)
  end
  return {1}
end
local start
if phase == '1' then
  start = now
  for _, k in ipairs(keys) do
    for _, w in ipairs(k.windows) do start = math.max(start, tat(k.key, w[1]) - w[3]) end
  end
  if ARGV[3] ~= '' and start < tonumber(ARGV[3]) then return {2, string.format('%d', start)} end
else
  start = tonumber(ARGV[3])
  for _, k in ipairs(keys) do
    if (redis.call('HGET', k.key, 'v') or '') ~= k.version then phase = '3' end
  end
  if phase == '3' then
    -- another booking came in between: keep mine where it is, and book s* anew
    -- only if GCRA admits it here
    for _, k in ipairs(keys) do
      for _, w in ipairs(k.windows) do
        if tat(k.key, w[1]) - w[3] > start then return {0} end
      end
    end
  end
end
local out, before = {1, string.format('%d', start)}, {}
for _, k in ipairs(keys) do
  for _, w in ipairs(k.windows) do before[#before + 1] = redis.call('HGET', k.key, w[1]) or '-' end
end
for _, k in ipairs(keys) do
  local horizon, longest = start, 0
  for _, w in ipairs(k.windows) do
    local t = tat(k.key, w[1])
    if phase == '2' then t = t - w[2] end
    t = math.max(t, start) + w[2]
    redis.call('HSET', k.key, w[1], string.format('%d', t))
    horizon, longest = math.max(horizon, t), math.max(longest, w[4])
  end
  out[#out + 1] = redis.call('HINCRBY', k.key, 'v', 1)
  redis.call('PEXPIRE', k.key, string.format('%d', math.max(1, horizon - now + longest)))
end
if phase ~= '1' then return {1} end
for _, t in ipairs(before) do out[#out + 1] = t end
return out
""",
)


def rated(acquire: Script) -> Script:
    """``acquire`` and the rate in one call: a rated start costs one round.

    Each script runs as a function of its own ``KEYS`` and ``ARGV`` (the
    parameters shadow the globals), so both keep their documented layout.
    KEYS: the acquire's keys (ARGV[1] of them), then the r rate hashes, then
    the r keys of their recorded starts. ARGV[2] the count of the acquire's
    args, then those args, then: mode ('b' book a start, 'r' the start was
    booked before: record it only), the client's clock in ms, the instant up
    to which a booking counts as due now (ms), how long starts are kept (ms,
    the longest period), how many are kept at most, the member recording this
    start (the owner value), the positions among the acquire's keys of the
    keys a grant sets to the owner value (separated by spaces), r, then
    (mode 'b') RATE's args for phase 1.
    A grant books the start (a contended start books nothing). Where this
    node's instant is due, it records the start in each sorted set of starts
    (score: the client's clock) and its reply is the acquire's; where it is
    not, it lets go of the keys it set (a start booked for later holds nothing,
    so it stands in no due start's way) and its reply is {7}. Either way the
    booking is appended (RATE's phase-1 reply, or false in mode 'r'). Any
    other reply is the acquire's.
    """
    return Script(
        f"{acquire.name}_rated",
        f"""
local function acquire(KEYS, ARGV)
{acquire.text}
end
local function book(KEYS, ARGV)
{RATE.text}
end
local na, nv = tonumber(ARGV[1]), tonumber(ARGV[2])
local akeys, aargs = {{}}, {{}}
for i = 1, na do akeys[i] = KEYS[i] end
for i = 1, nv do aargs[i] = ARGV[2 + i] end
local reply = acquire(akeys, aargs)
if reply[1] ~= 1 then return reply end
local o = 3 + nv
local mode, now, due = ARGV[o], tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2])
local keep, cap = tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
local member, held, nr = ARGV[o + 5], ARGV[o + 6], tonumber(ARGV[o + 7])
local booking, at = false, now
if mode == 'b' then
  local rkeys, rargs = {{}}, {{}}
  for i = 1, nr do rkeys[i] = KEYS[na + i] end
  for i = o + 8, #ARGV do rargs[#rargs + 1] = ARGV[i] end
  booking = book(rkeys, rargs)
  at = tonumber(booking[2])
end
if at > due then
  for pos in string.gmatch(held, '%d+') do
    local key = akeys[tonumber(pos)]
    if redis.call('GET', key) == member then redis.call('DEL', key) end
  end
  reply = {{7}}
else
  for i = 1, nr do
    local starts = KEYS[na + nr + i]
    redis.call('ZADD', starts, now, member)
    redis.call('ZREMRANGEBYSCORE', starts, '-inf', '(' .. string.format('%d', now - keep))
    redis.call('ZREMRANGEBYRANK', starts, 0, -(cap + 1))
    redis.call('PEXPIRE', starts, keep)
  end
end
reply[#reply + 1] = booking
return reply
""",
    )


#: The plain lock's acquire and the rate in one call (see :func:`rated`).
ACQUIRE_RATED = rated(ACQUIRE)
#: A permit's acquire and the rate in one call (see :func:`rated`).
ACQUIRE_PERMIT_RATED = rated(ACQUIRE_PERMIT)

# KEYS the lock keys an attempt may hold (ARGV[2] of them), then the sorted
# sets of starts; ARGV[1] the owner value. A rated grant whose booked instant
# is not due now: its lock keys are freed where they hold the owner, and the
# start it recorded is taken back. Returns how many lock keys it deleted.
UNSTART = Script(
    "unstart",
    """
local n, out = tonumber(ARGV[2]), 0
for i, key in ipairs(KEYS) do
  if i <= n then
    if redis.call('GET', key) == ARGV[1] then out = out + redis.call('DEL', key) end
  else
    redis.call('ZREM', key, ARGV[1])
  end
end
return out
""",
)
