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

__all__ = ["Script", "ACQUIRE", "FENCE", "EXTEND", "RELEASE", "RELEASE_PREFIX", "INSPECT", "CLAIM"]


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

# KEYS[1] lock key, KEYS[2] fence key
# ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] fence retention in ms ('' with
# fencing off), ARGV[4] the client's clock in microseconds (decimal).
# Returns {0, holder, pttl_ms} when another owner holds the key. Otherwise the
# key is set (or, already mine, its TTL refreshed: a re-sent acquire is
# harmless) and it returns {1} with fencing off, else {1, fence}: the node's
# fence value, moved on to its successor by this grant, or seeded with
# max(client clock, node clock to the second) where the node has none. A
# re-sent acquire returns the value its first send wrote.
ACQUIRE = Script(
    "acquire",
    _GREATER
    + _SUCCESSOR
    + """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return {0, holder, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[3] == '' then return {1} end
local fence = redis.call('GET', KEYS[2])
if fence then
  if holder then return {1, fence} end
  fence = successor(fence)
else
  fence = redis.call('TIME')[1] .. '000000'
  if greater(ARGV[4], fence) then fence = ARGV[4] end
end
redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
return {1, fence}
""",
)

# KEYS[1] lock key, KEYS[2] fence key
# ARGV[1] owner, ARGV[2] token (decimal string), ARGV[3] fence retention in ms
# Returns 1 when this node now records the token (or already did), 0 when
# the node no longer holds my owner value or records a larger token.
FENCE = Script(
    "fence",
    _GREATER
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local fence = redis.call('GET', KEYS[2])
if fence and fence ~= ARGV[2] and not greater(ARGV[2], fence) then return 0 end
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
RELEASE = Script(
    "release",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""",
)

# KEYS[1] lock key; ARGV[1] owner prefix (task id and separator).
# Deletes the key only when its owner value starts with the prefix, so a parent
# process can free the lock of a child that died without knowing its random part.
RELEASE_PREFIX = Script(
    "release_prefix",
    """
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, #ARGV[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
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
