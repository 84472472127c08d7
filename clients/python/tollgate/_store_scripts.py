"""The Lua scripts store mode runs on Redis, the same text as the Rust client's (a test in
crates/client checks that they are), so that Python and Rust processes share one group's pool:
``register`` (at start), ``sync`` (every sync interval: the heartbeat, the size reported, and
the agreement), ``deregister`` (at close) and ``take`` (units of a group's quotas per window,
from every window's counter at once, as much as the tightest has left)."""

REGISTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now)
local live = redis.call('HLEN', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], live)
local resume = false
if ARGV[2] == '1' then resume = redis.call('GET', KEYS[3]) end
return {live, resume}
"""

SYNC = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local stale = tonumber(ARGV[3])
local beats = redis.call('HGETALL', KEYS[1])
for i = 1, #beats, 2 do
  if now - tonumber(beats[i + 1]) > stale then
    redis.call('HDEL', KEYS[1], beats[i])
    redis.call('HDEL', KEYS[2], beats[i])
  end
end
local live = redis.call('HLEN', KEYS[1])
local lo, hi = nil, 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
  local n = tonumber(v)
  if lo == nil or n < lo then lo = n end
  if n > hi then hi = n end
end
if lo == hi and hi == live then return {1, hi, live} end
return {0, hi, live}
"""

DEREGISTER = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[2] ~= '' then
  local prev = tonumber(redis.call('GET', KEYS[3]) or '-1')
  if tonumber(ARGV[2]) >= prev then
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
  end
end
return 1
"""

TAKE = """
local n = #KEYS
local want = tonumber(ARGV[2 * n + 1])
local left, ends = nil, nil
for i = 1, n do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  local room = tonumber(ARGV[i]) - used
  if left == nil or room < left then left = room end
end
if left < 0 then left = 0 end
local take = math.min(want, math.max(math.min(1, left), math.floor(left / 2)))
if left >= 1 then take = math.max(math.floor(take), math.min(1, left)) end
for i = 1, n do
  local span = tonumber(ARGV[n + i])
  if take > 0 then redis.call('INCRBYFLOAT', KEYS[i], take) end
  local ttl = redis.call('PTTL', KEYS[i])
  if span > 0 and ttl < 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], span)
    ttl = span
  end
  if ttl > 0 and (ends == nil or ttl < ends) then ends = ttl end
end
return {tostring(take), tostring(left - take), ends or 0}
"""
