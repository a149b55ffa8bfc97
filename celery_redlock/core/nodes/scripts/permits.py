"""The permits' acquire: one of K keys of a name, and of other names held together."""

from __future__ import annotations

from .shared import ADVANCE, GATES, GREATER, SUCCESSOR, Script

__all__ = ["ACQUIRE_PERMIT"]

# KEYS[1] the name's lock key (permit 0), KEYS[2] its fence key, KEYS[3..5]
# receipt, claim and throttle keys (the lock key standing in for those
# unused; see GATES), KEYS[6..] the name's other permit keys.
# ARGV[1..4] as ACQUIRE, ARGV[5..9] as GATES ('' where unused), ARGV[10] the
# preferred index (0-based, or '').
# The script takes, in this order, the permit already mine (a re-sent
# acquire), the permit at index ARGV[10] if free, else the lowest free one. A
# permit held by another copy of my task id (ARGV[5] .. '|') stops the grant
# as if every permit were held; so does every permit held:
# {0, holder, pttl_ms, claimant or false} for the permit that frees first.
# Flag 'a', other names held together: ARGV[11] is the count of my name's
# permits, then per other name a pair ARGV[12+2j], ARGV[13+2j]: its permit
# count and preferred index, and after my name's keys, per other name, its
# fence key then its permit keys. Every name is checked before anything is
# set (all or nothing on this node): {5, j, holder, pttl_ms} when the j-th
# other name (1-based) has no permit to take. Keys of several names live in
# several hash slots: a node that is itself a Redis Cluster refuses this.
# A grant returns {1, fence or false, index, fence_1, index_1, ...}, and
# always moves the fence on (even when re-sent): other permits' grants may
# have moved it since, and a value returned twice would be two holders'.
ACQUIRE_PERMIT = Script(
    "acquire_permit",
    GREATER
    + SUCCESSOR
    + ADVANCE
    + GATES
    + """
local copy = ARGV[5] ~= '' and ARGV[5] .. '|'
-- Among one name's permit keys: the one mine, the preferred one if free, the
-- lowest free one: key, index, holder (mine or false); or, none to take:
-- false, the holder that stops me, its pttl.
local function pick(keys, prefer)
  local free, at, busy, left = false, 0, false, 0
  for i, k in ipairs(keys) do
    local h = redis.call('GET', k)
    if h == ARGV[1] then return k, i - 1, h end
    if not h then
      if not free or i - 1 == prefer then free, at = k, i - 1 end
    else
      local p = redis.call('PTTL', k)
      if copy and string.sub(h, 1, #copy) == copy then return false, h, p end
      if not busy or p < left then busy, left = h, p end
    end
  end
  if free then return free, at, false end
  return false, busy, left
end
local stop = gate_enter()
if stop then return stop end
local also = flag('a')
local count = also and tonumber(ARGV[11]) or #KEYS - 4
local mine = {KEYS[1]}
for n = 6, 4 + count do mine[#mine + 1] = KEYS[n] end
local key, index, holder = pick(mine, tonumber(ARGV[10]))
if not key then return {0, index, holder, claim} end
stop = gate_free()
if stop then return stop end
local extra = {}
if also then
  local pos, a = 4 + count, 12
  while ARGV[a] do
    local keys = {}
    for n = pos + 2, pos + 1 + tonumber(ARGV[a]) do keys[#keys + 1] = KEYS[n] end
    local k, i, h = pick(keys, tonumber(ARGV[a + 1]))
    if not k then return {5, #extra + 1, i, h} end
    extra[#extra + 1] = {KEYS[pos + 1], k, i}
    pos, a = pos + 1 + #keys, a + 2
  end
end
redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
gate_granted()
local fenced = ARGV[3] ~= ''
local out = {1, fenced and advance(KEYS[2], false), index}
for _, e in ipairs(extra) do
  redis.call('SET', e[2], ARGV[1], 'PX', ARGV[2])
  out[#out + 1] = fenced and advance(e[1], false)
  out[#out + 1] = e[3]
end
return out
""",
)
