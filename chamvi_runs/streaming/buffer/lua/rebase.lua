-- Stores a rebuild as a region after the run's latest seq and returns it, or returns what a held
-- region or the buffer already gives (RedisEventLog.rebase). After trim.lua.
-- KEYS: seq counter, events, region, bytes (RedisEventLog._keys).
-- ARGV: 1 the buffer's ttl, 2 the counter's ttl, 3 the event cap, 4 the highest step rebuilt,
-- 5 the waiting tokens, 6 truncated ('1' or '0'), 7 the marker's JSON, 8 after (-1: none), 9 the
-- byte cap, then the rebuilt events' JSON. What is carried after them is rules.carried's rule.
local top = tonumber(redis.call('GET', KEYS[1]) or '0')
if redis.call('TYPE', KEYS[2]).ok ~= 'zset' then redis.call('DEL', KEYS[2]) end
local held = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local low = top + 1
if #held > 0 then
  low = tonumber(held[2])
  top = math.max(top, tonumber(held[#held]))
end
local after = tonumber(ARGV[8])
local first = tonumber(redis.call('HGET', KEYS[3], 'seq') or '-1')
if first >= low then return redis.call('ZRANGEBYSCORE', KEYS[2], first, '+inf') end
if after >= 0 and top > 0 and not (after < low - 1 and after < top) then
  return redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. after, '+inf')
end
local step, waiting = tonumber(ARGV[4]), ARGV[5]
local decoded, cut, bytes = {}, 0, 0
for i = 1, #held, 2 do
  local ok, event = pcall(cjson.decode, held[i])
  if not ok or type(event) ~= 'table' then event = {} end
  local seq = tonumber(held[i + 1])
  decoded[#decoded + 1] = {held[i], seq, event}
  bytes = bytes + #held[i]
  if type(event.step) == 'number' and event.step >= 0 and event.step <= step then cut = seq end
end
local seq, out = top, {}
local function push(prefix)
  seq = seq + 1
  local encoded = prefix .. ',"seq":' .. seq .. '}'
  redis.call('ZADD', KEYS[2], seq, encoded)
  bytes = bytes + #encoded
  out[#out + 1] = encoded
end
if top > 0 or ARGV[6] == '1' then push(string.sub(ARGV[7], 1, -2)) end
for i = 10, #ARGV do push(string.sub(ARGV[i], 1, -2)) end
for _, item in ipairs(decoded) do
  local event, keep = item[3], false
  if event.type == 'run.start' or event.type == 'replay.truncated' then
    keep = false
  elseif type(event.step) == 'number' and event.step >= 0 then
    keep = event.step > step
  else
    local token = ''
    if event.type == 'run.waiting' and type(event.approval_id) == 'string' then
      token = 'w:' .. event.approval_id
    end
    keep = item[2] > cut and not (token ~= '' and (token == waiting
      or string.find(waiting, ' ' .. token .. ' ', 1, true) ~= nil))
  end
  if keep then push((string.gsub(item[1], ',"seq":%d+}$', ''))) end
end
redis.call('SET', KEYS[1], seq, 'EX', ARGV[2])
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'seq', top + 1, 'step', step, 'waiting', waiting)
-- Trimmed to the caps, never into the region.
bytes = trim(tonumber(ARGV[3]), tonumber(ARGV[9]), bytes, #held / 2)
redis.call('SET', KEYS[4], bytes, 'EX', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[3], ARGV[1])
return out
