-- What the buffer holds after a seq: {top, 1, events}, or {top, 0, {}} when some are gone and no
-- region covers them (rules.Window). KEYS: seq counter, events, region. ARGV: 1 the seq.
local after = tonumber(ARGV[1])
local top = tonumber(redis.call('GET', KEYS[1]) or '0')
local low = top + 1
local zset = redis.call('TYPE', KEYS[2]).ok == 'zset'
if zset then
  low = tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2])
  top = math.max(top, tonumber(redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]))
end
local start = after
if after < low - 1 and after < top then
  local first = tonumber(redis.call('HGET', KEYS[3], 'seq') or '-1')
  if first < low then return {top, 0, {}} end
  start = first - 1
end
if not zset then return {top, 1, {}} end
return {top, 1, redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. start, '+inf')}
