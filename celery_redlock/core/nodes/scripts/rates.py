"""The rate reservation: GCRA per window, booked in two phases (see :mod:`..rates`).

None of the helpers of :mod:`.shared` applies: a rate hash holds instants, not
tokens or owners, and numbers in ms stay far below 2**53.
"""

from __future__ import annotations

from .lease import ACQUIRE
from .permits import ACQUIRE_PERMIT
from .shared import Script

__all__ = ["ACQUIRE_PERMIT_RATED", "ACQUIRE_RATED", "RATE", "UNSTART", "rated"]

# KEYS the rate hashes of the keys booked together, then as many sorted sets of
# their bookings (the log: member the booking's id, score its instant).
# ARGV[1] '1' (phase 1: book the first admitted instant), '2' (phase 2:
# compare-and-set) or '0' (undo phase 1); ARGV[2] the client's clock in ms;
# ARGV[3] s* in ms (phase 2); in an undo, where the booking goes in the logs ('-':
# out; an instant: there, the reservation stood at it) and the paced windows'
# TATs before phase 1 (one per window in order, '-' where there was none or the
# window counts), separated by spaces; or in phase 1 '' or the instant (ms) before which it books
# nothing: then an earlier first admitted instant s is answered {2, s} and
# nothing changes; then per key: the version phase 1 answered (phases 2 and 0;
# it is the booking's id) or '', the count m of its windows, then m times:
# field, T ms, tau ms, period ms, and N for a counted window or 0 for the paced one.
# The paced window's field holds its TAT (GCRA). A counted window admits s when
# its N-th latest booking in the log is at or before s - period (so every window
# of the period holding s holds at most N, wherever in the log s falls); the
# log keeps the bookings of the longest counted period.
# Phase 1 returns {1, s, v_1, ..., v_k, tat_1, ...}: the instant booked, each
# hash's new version (the booking's id), and each window's TAT before (or '-').
# Phase 2 first takes this booking out of the logs; it returns {1} when every
# hash still had the version given, and then moves this node's last booking from
# its own instant to s* (the TATs; the logs where they admit s*); or, a booking
# came in between, when every window admits s* here, booked anew beside it (the
# logs: moved); else {0}. Undo takes the booking out of the logs or moves it to
# where it stood (always: a log knows its bookings by id), and returns {1} when
# every hash still had the version given, and then puts the TATs back as they
# were before phase 1; else {0}: a booking came after mine, whose TATs stay.
RATE = Script(
    "rate",
    """
local phase, now = ARGV[1], tonumber(ARGV[2])
local keys, a, nk = {}, 4, #KEYS / 2
for i = 1, nk do
  local k = {key = KEYS[i], log = KEYS[nk + i], version = ARGV[a], windows = {}, counts = 0}
  local m = tonumber(ARGV[a + 1])
  a = a + 2
  for j = 1, m do
    local w = {ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
               tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])}
    k.windows[j] = w
    if w[5] > 0 then k.counts = math.max(k.counts, w[4]) end
    a = a + 5
  end
  keys[i] = k
end
local function ms(t) return string.format('%d', t) end
local function tat(key, field) return tonumber(redis.call('HGET', key, field) or '0') end
-- the first instant window w of key k admits
local function admits(k, w)
  if w[5] == 0 then return tat(k.key, w[1]) - w[3] end
  local nth = redis.call('ZREVRANGE', k.log, w[5] - 1, w[5] - 1, 'WITHSCORES')
  if #nth == 0 then return 0 end
  return tonumber(nth[2]) + w[4]
end
local function same(k) return (redis.call('HGET', k.key, 'v') or '') == k.version end
local before = string.gmatch(ARGV[3], '%S+')
local at = phase == '0' and before() or '-'
for _, k in ipairs(keys) do
  if phase ~= '1' and k.counts > 0 then
    if at == '-' then
      redis.call('ZREM', k.log, k.version)
    else
      redis.call('ZADD', k.log, at, k.version)
      local ttl = tonumber(at) - now + k.counts
      if redis.call('PTTL', k.log) < ttl then redis.call('PEXPIRE', k.log, ms(ttl)) end
    end
  end
end
if phase == '0' then
  for _, k in ipairs(keys) do
    if not same(k) then return {0} end
  end
  for _, k in ipairs(keys) do
    for _, w in ipairs(k.windows) do
      local t = before()
      if w[5] > 0 then
      elseif t == nil or t == '-' then
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
    for _, w in ipairs(k.windows) do start = math.max(start, admits(k, w)) end
  end
  if ARGV[3] ~= '' and start < tonumber(ARGV[3]) then return {2, ms(start)} end
else
  start = tonumber(ARGV[3])
  for _, k in ipairs(keys) do
    if not same(k) then phase = '3' end
  end
  -- the counted windows must admit s* here; after another booking came in
  -- between, the paced ones too (mine stays where it is and s* is booked anew)
  for _, k in ipairs(keys) do
    for _, w in ipairs(k.windows) do
      if (w[5] > 0 or phase == '3') and admits(k, w) > start then return {0} end
    end
  end
end
local out, before = {1, ms(start)}, {}
for _, k in ipairs(keys) do
  for _, w in ipairs(k.windows) do
    before[#before + 1] = w[5] == 0 and redis.call('HGET', k.key, w[1]) or '-'
  end
end
for _, k in ipairs(keys) do
  local horizon, longest = start, 0
  for _, w in ipairs(k.windows) do
    if w[5] == 0 then
      local t = tat(k.key, w[1])
      if phase == '2' then t = t - w[2] end
      t = math.max(t, start) + w[2]
      redis.call('HSET', k.key, w[1], ms(t))
      horizon = math.max(horizon, t)
    end
    longest = math.max(longest, w[4])
  end
  local v = redis.call('HINCRBY', k.key, 'v', 1)
  out[#out + 1] = v
  local ttl = ms(math.max(1, horizon - now + longest))
  redis.call('PEXPIRE', k.key, ttl)
  if k.counts > 0 then
    redis.call('ZADD', k.log, start, phase == '1' and v or k.version)
    redis.call('ZREMRANGEBYSCORE', k.log, '-inf', '(' .. ms(now - k.counts))
    redis.call('PEXPIRE', k.log, ttl)
  end
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
    KEYS: the acquire's keys (ARGV[1] of them), then the r rate hashes, the r
    logs of their bookings, and the r keys of their recorded starts. ARGV[2]
    the count of the acquire's args, then those args, then: mode ('b' book a
    start, 'r' the start was booked before: record it only), the client's clock
    in ms, the instant up to which a booking counts as due now (ms), how long
    starts are kept (ms, the longest period), how many are kept at most, the
    member recording this start (the owner value), the positions among the
    acquire's keys of the keys a grant sets to the owner value (separated by
    spaces), r, then (mode 'b') RATE's args for phase 1.
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
  for i = 1, 2 * nr do rkeys[i] = KEYS[na + i] end
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
    local starts = KEYS[na + 2 * nr + i]
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
