"""The queues' scripts: a name's calls waiting in publish order, and the hand-over
of the name to the first of them."""

from __future__ import annotations

from .shared import Script

__all__ = ["QUEUE_NEXT", "QUEUE_PARK", "QUEUE_PEEK"]

# KEYS[1] queue: a sorted set of waiting ids, scored by ticket; KEYS[2] calls:
# a hash of id -> the call to publish, and '#', the last ticket issued.
# ARGV[1] id, ARGV[2] the call, ARGV[3] most ids waiting (0: no bound),
# ARGV[4] how long both keys outlive their last change, in ms, ARGV[5] a ticket
# agreed by a quorum ('' for none), ARGV[6] '1' when the newest call wins.
# Park: ARGV[1] waits behind every id parked on this node before it; its ticket
# is the node's next one, raised to ARGV[5] (the write-back that makes nodes
# agree on one order: the largest ticket of the first round), and the node's
# last ticket never goes back. An id already waiting keeps its place (a re-sent
# call), its ticket only raised.
# With ARGV[6] '1' (supersede), every other id waiting is taken out first: the
# reply names them after the ticket.
# Returns {1, position (1 first), ticket, taken out...} once ARGV[1] waits,
# {0, waiting} when ARGV[3] ids already wait and ARGV[1] is not one of them.
QUEUE_PARK = Script(
    "queue_park",
    """
local out = {}
if ARGV[6] == '1' then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if id ~= ARGV[1] then
      redis.call('ZREM', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      table.insert(out, id)
    end
  end
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local floor = tonumber(ARGV[5])
local ticket
if score then
  ticket = tonumber(score)
else
  local most, waiting = tonumber(ARGV[3]), redis.call('ZCARD', KEYS[1])
  if most > 0 and waiting >= most then return {0, waiting} end
  ticket = (tonumber(redis.call('HGET', KEYS[2], '#')) or 0) + 1
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
if floor and floor > ticket then ticket = floor end
redis.call('ZADD', KEYS[1], ticket, ARGV[1])
if ticket > (tonumber(redis.call('HGET', KEYS[2], '#')) or 0) then
  redis.call('HSET', KEYS[2], '#', string.format('%d', ticket))
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
local reply = {1, redis.call('ZRANK', KEYS[1], ARGV[1]) + 1, string.format('%d', ticket)}
for _, id in ipairs(out) do table.insert(reply, id) end
return reply
""",
)

# KEYS[1] the name's claim key, KEYS[2] queue, KEYS[3] calls (see QUEUE_PARK),
# KEYS[4..] the name's lock key and permit keys.
# ARGV[1] an id to take out of the queue first ('' for none), ARGV[2] an owner
# whose lock key counts as free (a holder handing over before it lets go; ''
# for none), ARGV[3] how long a hand-over's claim lives, in ms ('' to take out
# only), ARGV[4] how long the queue's keys outlive this change, in ms.
# Next: when no claim is pending (a started mark is none, nor a claim of an id
# no longer waiting here: it started, or left, and its claim's take missed this
# node), a lock key (or permit) is free, and an id waits, the claim is pointed
# at the first id waiting (lowest ticket, then id), which stays in the queue
# until it starts.
# Every reply begins with 1 if ARGV[1] was taken out, else 0; then
# {., 0, claimant, pttl_ms} a hand-over is pending; {., 2} nobody waits;
# {., 1, held} every lock key is held; {., 3, id, call, ticket, waiting} the claim
# now names id (waiting counts it); {., 4} taken out only.
QUEUE_NEXT = Script(
    "queue_next",
    """
local out = 0
if ARGV[1] ~= '' then
  out = redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
if ARGV[3] == '' then return {out, 4} end
local claim = redis.call('GET', KEYS[1])
if claim and string.sub(claim, 1, 1) ~= '~' and redis.call('ZSCORE', KEYS[2], claim) then
  return {out, 0, claim, redis.call('PTTL', KEYS[1])}
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #head == 0 then return {out, 2} end
local held = 0
for i = 4, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= ARGV[2] then held = held + 1 end
end
if held >= #KEYS - 3 then return {out, 1, held} end
redis.call('SET', KEYS[1], head[1], 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
local call = redis.call('HGET', KEYS[3], head[1]) or ''
return {out, 3, head[1], call, head[2], redis.call('ZCARD', KEYS[2])}
""",
)

# KEYS[1] queue, KEYS[2] calls (see QUEUE_PARK). Read only.
# Returns {waiting, first id or false, its call or false, its ticket or false}.
QUEUE_PEEK = Script(
    "queue_peek",
    """
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #head == 0 then return {0, false, false, false} end
return {redis.call('ZCARD', KEYS[1]), head[1], redis.call('HGET', KEYS[2], head[1]), head[2]}
""",
)
