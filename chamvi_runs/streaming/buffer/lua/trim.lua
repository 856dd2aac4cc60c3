-- Shared by append.lua and rebase.lua, which follow it in one script: drops the oldest events of
-- KEYS[2], at most `droppable`, while over either cap, and returns the bytes left. The byte count
-- is kept beside the events (KEYS[4]) so as not to read every event: counted again from them when
-- it is missing (an older version's buffer, an evicted key), and exact whenever one event is left.
-- Trimming never drops the newest event.
local function trim(cap, cap_bytes, bytes, droppable)
  local count = redis.call('ZCARD', KEYS[2])
  if not bytes then
    bytes = 0
    for _, event in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do bytes = bytes + #event end
  end
  while droppable > 0 and count > 1 and (count > cap or bytes > cap_bytes) do
    bytes = bytes - #redis.call('ZPOPMIN', KEYS[2])[1]
    count, droppable = count - 1, droppable - 1
  end
  if count == 1 then bytes = #redis.call('ZRANGE', KEYS[2], 0, 0)[1] end
  return bytes
end
