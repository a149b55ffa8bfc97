"""What every script is made of: the :class:`Script` record and the Lua helpers
written once and composed into the scripts that need them.

Redis runs Lua 5.1, whose numbers are doubles: a fencing token above 2**53
would lose precision, and large numbers print in exponent form. So no script
does number arithmetic on a token; tokens travel as decimal strings, Lua
compares them and takes their successor as strings of digits.
"""

from __future__ import annotations

from hashlib import sha1

__all__ = ["ADVANCE", "GATES", "GREATER", "OWNS", "SUCCESSOR", "Script"]


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
GREATER = """
local function greater(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
"""

# Decimal-string successor of a fence value (digits only, no leading zeros).
SUCCESSOR = """
local function successor(s)
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) .. string.rep('0', #s - i)
end
"""

# True when the key holds exactly the owner value (ownership is the whole value).
OWNS = """
local function owns(key, owner)
  return redis.call('GET', key) == owner
end
"""

# The fence value of a grant (needs GREATER and SUCCESSOR): max(the node's value
# moved on, the floor), kept as is when ``again`` (a re-sent plain acquire).
# The floor is max(the node's clock, the client's clock ARGV[4] a second on),
# in microseconds: never below the node's clock, so a value left from another
# node list, a restore or last week cannot hold tokens below ones handed out
# since. The client's second on is what the nodes of one round share: their
# clocks differ by microseconds, the client's is one value, so nodes that saw
# the same grants still return the same value (one round, not a write-back).
# All as digit strings. Written with the retention ARGV[3] in ms.
ADVANCE = """
local function fence_floor()
  local t = redis.call('TIME')
  local node = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  local c = ARGV[4]
  if #c <= 6 then c = '1' .. string.rep('0', 6 - #c) .. c
  else c = successor(string.sub(c, 1, #c - 6)) .. string.sub(c, -6) end
  if greater(c, node) then return c end
  return node
end
local function advance(fkey, again)
  local fence = redis.call('GET', fkey)
  if fence and again then return fence end
  local floor = fence_floor()
  if fence then fence = successor(fence) end
  if not fence or greater(floor, fence) then fence = floor end
  redis.call('SET', fkey, fence, 'PX', ARGV[3])
  return fence
end
"""

# The checks an acquire makes for its caller's id, shared by the lock and the
# permits. KEYS[3] receipt key, KEYS[4] claim key, KEYS[5] throttle key;
# ARGV[5] the caller's id, ARGV[6] flags, ARGV[7] throttle period in ms,
# ARGV[8] the client's clock in ms, ARGV[9] a throttled call's planned slot.
# Flags: 'r' a receipt at KEYS[3] means that id already finished; 'c' a claim
# at KEYS[4] naming another id stops the grant; 's' (the caller was claimed at
# publish) so does the started mark of another id (it replaced the caller and
# ran), while no claim at all (it lapsed, or was never written on this node)
# lets the caller contend as any other execution; 'w' a claim
# naming ARGV[5] is withdrawn on grant, leaving '~' .. ARGV[5] for the rest of
# its TTL: the mark of a claimed run that started, which tells a message it
# replaced that it was superseded, and counts as no claim for anyone else;
# 't' at most one grant per ARGV[7] ms: the throttle hash KEYS[5] keeps the
# last grant's time ('start', ARGV[8]); with ARGV[9], a slot the hash gives
# another id stops the grant, and the caller counts as the key's claimant.
# gate_enter() runs before the keys are looked at, gate_free() once the key to
# take is free, gate_granted() after it is set; the first two return a reply
# that stops the grant ({2}, {3, claimant, pttl_ms}, {4, wait_ms}) or nil.
GATES = """
local flags = ARGV[6] or ''
local function flag(f) return string.find(flags, f, 1, true) end
local claim, own, throttled = false, flag('s'), flag('t')
local function gate_enter()
  if flag('r') and redis.call('EXISTS', KEYS[3]) == 1 then return {2} end
  if flag('c') then
    claim = redis.call('GET', KEYS[4])
    if claim == '~' .. ARGV[5] then
      claim = ARGV[5]
    elseif claim and not own and string.sub(claim, 1, 1) == '~' then
      claim = false
    end
  end
  if throttled and ARGV[9] and ARGV[9] ~= '' then
    local h = redis.call('HMGET', KEYS[5], 'due', 'id', 'pdue', 'pid')
    local winner = (h[1] == ARGV[9] and h[2]) or (h[3] == ARGV[9] and h[4])
    if winner and winner ~= ARGV[5] then return {3, winner, -1} end
    claim = ARGV[5]
  end
end
local function gate_free()
  if claim and claim ~= ARGV[5] then return {3, claim, redis.call('PTTL', KEYS[4])} end
  if throttled then
    local started = tonumber(redis.call('HGET', KEYS[5], 'start'))
    local wait = started and started + tonumber(ARGV[7]) - tonumber(ARGV[8])
    if wait and wait > 0 then return {4, wait} end
  end
end
local function gate_granted()
  if claim and flag('w') then
    local left = redis.call('PTTL', KEYS[4])
    if left > 0 then redis.call('SET', KEYS[4], '~' .. ARGV[5], 'PX', left) end
  end
  if throttled then
    redis.call('HSET', KEYS[5], 'start', ARGV[8])
    if redis.call('PTTL', KEYS[5]) < tonumber(ARGV[7]) then
      redis.call('PEXPIRE', KEYS[5], ARGV[7])
    end
  end
end
"""
