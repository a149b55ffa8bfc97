"""The rate reservation: GCRA per window, booked in two phases (see :mod:`..rates`).

None of the helpers of :mod:`.shared` applies: a rate hash holds instants, not
tokens or owners, and numbers in ms stay far below 2**53.
"""

from __future__ import annotations

from .shared import Script

__all__ = ["RATE"]

# KEYS the rate hashes of the keys booked together.
# ARGV[1] '1' (phase 1: book the first admitted instant), '2' (phase 2:
# compare-and-set) or '0' (undo phase 1); ARGV[2] the client's clock in ms;
# ARGV[3] s* in ms (phase 2), the TATs before phase 1 (undo: one per window
# in order, '-' where there was none, separated by spaces) or ''; then per
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
