"""The Lua scripts run on every node.

Redis runs Lua 5.1, whose numbers are doubles: a fencing token above 2**53
would lose precision, and large numbers print in exponent form. So no script
does number arithmetic on a token; tokens travel as decimal strings, Lua
compares them and takes their successor as strings of digits.

Every script is idempotent when re-sent, so a reply lost to a timeout never
turns into a wrong answer on the next call.
"""

from __future__ import annotations

from hashlib import sha1

__all__ = [
    "ACQUIRE",
    "CLAIM",
    "CLAIM_NEXT",
    "DEBOUNCE",
    "EXTEND",
    "FENCE",
    "INSPECT",
    "PEEK",
    "RELEASE",
    "RELEASE_PREFIX",
    "Script",
    "THROTTLE",
]


class Script:
    """A script's text and SHA-1, sent as EVALSHA with an EVAL fallback on NOSCRIPT."""

    __slots__ = ("name", "text", "sha")

    def __init__(self, name: str, text: str):
        self.name = name
        self.text = text
        self.sha = sha1(text.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


# Digits-only comparison: true when token a > token b (both without leading zeros).
_GREATER = """
local function greater(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
"""

# Decimal-string successor of a fence value (digits only, no leading zeros).
_SUCCESSOR = """
local function successor(s)
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) .. string.rep('0', #s - i)
end
"""

# KEYS[1] lock key, KEYS[2] fence key; with ARGV[5]: KEYS[3] receipt key, KEYS[4] claim key,
# KEYS[5] throttle key
# ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] fence retention in ms ('' with
# fencing off), ARGV[4] the client's clock in microseconds (decimal).
# Optional: ARGV[5] the caller's id (a task id), ARGV[6] flags: 'r' a receipt
# at KEYS[3] means that id already finished; 'c' a claim at KEYS[4] naming
# another id stops the grant; 's' (the caller was claimed at publish) so does
# a claim that no longer names it, or none; 'w' a claim naming ARGV[5] is
# withdrawn on grant, leaving '~' .. ARGV[5] for the rest of its TTL: the
# mark of a claimed run that started, which tells a message it replaced that
# it was superseded, and counts as no claim for anyone else;
# 't' at most one grant per ARGV[7] ms: the throttle hash KEYS[5] keeps the
# last grant's time ('start', the client's clock ARGV[8] in ms); with ARGV[9]
# (a throttled call's planned slot), a slot the hash gives another id stops
# the grant, and the caller counts as the key's claimant;
# 'p' permits (``limit`` K > 1): the K permits of the name are KEYS[1] and
# KEYS[6..] (KEYS[3..5] are then always sent, the lock key standing in for
# those unused, and ARGV[5..10] too, '' where unused); the script takes, in this
# order, the permit already mine (a re-sent acquire), the permit at index
# ARGV[10] (0-based) if free, else the lowest free one. A permit held by
# another copy of my task id (ARGV[5] .. '|') stops the grant as if every
# permit were held; so does every permit held: {0, holder, pttl_ms, claim} for
# the permit that frees first. A grant returns {1, fence or false, index},
# and always moves the fence on (even when re-sent): other permits' grants
# may have moved it since, and a value returned twice would be two holders';
# 'a' (with 'p') other names held together: ARGV[11] is the count of my
# name's permits, then per other name a pair ARGV[12+2j], ARGV[13+2j]: its
# permit count and preferred index, and after my name's keys, per other name,
# its fence key then its permit keys. Every name is checked before anything
# is set (all or nothing on this node): {5, j, holder, pttl_ms} when the j-th
# other name (1-based) has no permit to take; a grant returns
# {1, fence, index, fence_1, index_1, ...}. Keys of several names live in
# several hash slots: a node that is itself a Redis Cluster refuses this.
# Returns {2} when the receipt exists; {0, holder, pttl_ms, claimant or false}
# when another owner holds the key; {3, claimant, pttl_ms} when the key is free
# but the claim names another id; {4, wait_ms} when the last throttled grant
# was less than a period ago. Otherwise the key is set (or,
# already mine, its TTL refreshed: a re-sent acquire is harmless) and it
# returns {1} with fencing off, else {1, fence}: the node's fence value, moved
# on to its successor by this grant, or seeded with max(client clock, node
# clock to the second) where the node has none. A re-sent acquire returns the
# value its first send wrote.
ACQUIRE = Script(
    "acquire",
    _GREATER
    + _SUCCESSOR
    + """
local flags = ARGV[6] or ''
if string.find(flags, 'r', 1, true) and redis.call('EXISTS', KEYS[3]) == 1 then return {2} end
local claim = false
local own = string.find(flags, 's', 1, true)
if string.find(flags, 'c', 1, true) then
  claim = redis.call('GET', KEYS[4])
  if claim == '~' .. ARGV[5] then
    claim = ARGV[5]
  elseif claim and not own and string.sub(claim, 1, 1) == '~' then
    claim = false
  end
end
local throttled = string.find(flags, 't', 1, true)
if throttled and ARGV[9] and ARGV[9] ~= '' then
  local h = redis.call('HMGET', KEYS[5], 'due', 'id', 'pdue', 'pid')
  local winner = (h[1] == ARGV[9] and h[2]) or (h[3] == ARGV[9] and h[4])
  if winner and winner ~= ARGV[5] then return {3, winner, -1} end
  claim = ARGV[5]
end
local key, index, holder = KEYS[1], 0, false
local permits = string.find(flags, 'p', 1, true)
local copy = permits and ARGV[5] ~= '' and ARGV[5] .. '|'
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
-- The fence value of a grant: the node's value moved on (kept as is when the
-- key was already mine: a re-sent plain acquire), or seeded from the clocks.
local function advance(fkey, again)
  local fence = redis.call('GET', fkey)
  if fence then
    if again then return fence end
    fence = successor(fence)
  else
    fence = redis.call('TIME')[1] .. '000000'
    if greater(ARGV[4], fence) then fence = ARGV[4] end
  end
  redis.call('SET', fkey, fence, 'PX', ARGV[3])
  return fence
end
local also = string.find(flags, 'a', 1, true)
local count = also and tonumber(ARGV[11]) or #KEYS - 4
if permits then
  local mine = {KEYS[1]}
  for n = 6, 4 + count do mine[#mine + 1] = KEYS[n] end
  local k, i, h = pick(mine, tonumber(ARGV[10]))
  if not k then return {0, i, h, claim} end
  key, index, holder = k, i, h
else
  holder = redis.call('GET', KEYS[1])
  if holder and holder ~= ARGV[1] then
    return {0, holder, redis.call('PTTL', KEYS[1]), claim}
  end
end
if (claim or own) and claim ~= ARGV[5] then return {3, claim, redis.call('PTTL', KEYS[4])} end
if throttled then
  local started = tonumber(redis.call('HGET', KEYS[5], 'start'))
  local wait = started and started + tonumber(ARGV[7]) - tonumber(ARGV[8])
  if wait and wait > 0 then return {4, wait} end
end
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
if claim and string.find(flags, 'w', 1, true) then
  local left = redis.call('PTTL', KEYS[4])
  if left > 0 then redis.call('SET', KEYS[4], '~' .. ARGV[5], 'PX', left) end
end
if throttled then
  redis.call('HSET', KEYS[5], 'start', ARGV[8])
  if redis.call('PTTL', KEYS[5]) < tonumber(ARGV[7]) then
    redis.call('PEXPIRE', KEYS[5], ARGV[7])
  end
end
local fenced = ARGV[3] ~= ''
if not permits then
  if not fenced then return {1} end
  return {1, advance(KEYS[2], holder)}
end
local out = {1, fenced and advance(KEYS[2], false), index}
for _, e in ipairs(extra) do
  redis.call('SET', e[2], ARGV[1], 'PX', ARGV[2])
  out[#out + 1] = fenced and advance(e[1], false)
  out[#out + 1] = e[3]
end
return out
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
    _GREATER
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
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
    """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[2 * i - 1] then
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
# the claim is withdrawn if it names that id.
RELEASE = Script(
    "release",
    """
local out = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then out = redis.call('DEL', KEYS[1]) end
if ARGV[2] and ARGV[2] ~= '' then redis.call('SET', KEYS[2], '1', 'PX', ARGV[2]) end
if ARGV[3] and ARGV[3] ~= '' and redis.call('GET', KEYS[3]) == ARGV[3] then
  redis.call('DEL', KEYS[3])
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

# KEYS[1] lock key, KEYS[2] fence key. Returns {holder or false, pttl_ms, fence or false}.
INSPECT = Script(
    "inspect",
    """
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
""",
)

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
# ('~' .. id, see ACQUIRE) counts as no claim.
CLAIM_NEXT = Script(
    "claim_next",
    """
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, 1) == '~' then cur = false end
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

# KEYS[1] any key. Returns {value or false, pttl_ms}.
PEEK = Script(
    "peek",
    """
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
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
    """
local now = tonumber(ARGV[2])
local previous = redis.call('GET', KEYS[1])
if previous and string.sub(previous, 1, 1) == '~' then previous = false end
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
# latest actual start (ACQUIRE writes it).
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
