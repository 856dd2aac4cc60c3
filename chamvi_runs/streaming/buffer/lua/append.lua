-- Appends one event with the run's next seq; returns it as stored, or false. After trim.lua.
-- KEYS: seq counter, events, region, bytes (RedisEventLog._keys).
-- ARGV: 1 the event's JSON, 2 the buffer's ttl, 3 the counter's ttl, 4 the event cap, 5 the event's
-- step (-1: none), 6 its cover token, 7 'end' (a run.end) or 'repair' (RedisEventLog.end) or '',
-- 8 the byte cap.
-- The seq is spliced into the JSON text: cjson would turn empty lists into objects. An events key of
-- the old layout (a list) is replaced. 'end' and 'repair': one run.end per run, never after one; a
-- repair only after held events. pcall: cjson refuses some JSON that Python writes (a lone
-- surrogate), which is not a run.end either. The region test is rules.dropped's.
if ARGV[7] == 'end' or ARGV[7] == 'repair' then
  local held = redis.call('TYPE', KEYS[2]).ok == 'zset'
  if ARGV[7] == 'repair' and not held then return false end
  if held then
    local ok, last = pcall(cjson.decode, redis.call('ZRANGE', KEYS[2], -1, -1)[1])
    if ok and type(last) == 'table' and last.type == 'run.end' then return false end
  end
end
local covers = redis.call('HMGET', KEYS[3], 'step', 'waiting')
if covers[1] then
  local step, token = tonumber(ARGV[5]), ARGV[6]
  if (step >= 0 and step <= tonumber(covers[1])) or token == 'start' or (token ~= ''
      and (token == covers[2] or string.find(covers[2], ' ' .. token .. ' ', 1, true))) then
    return false
  end
end
if redis.call('TYPE', KEYS[2]).ok ~= 'zset' then redis.call('DEL', KEYS[2], KEYS[4]) end
local bytes = redis.call('GET', KEYS[4])
local seq = redis.call('INCR', KEYS[1])
local encoded = string.sub(ARGV[1], 1, -2) .. ',"seq":' .. seq .. '}'
redis.call('ZADD', KEYS[2], seq, encoded)
if bytes then bytes = tonumber(bytes) + #encoded end
bytes = trim(tonumber(ARGV[4]), tonumber(ARGV[8]), bytes, math.huge)
redis.call('SET', KEYS[4], bytes, 'EX', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[2])
return encoded
