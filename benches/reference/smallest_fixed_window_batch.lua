-- The smallest fixed-window script, batched: one call decides every subject of KEYS
-- (our own code). Redis TIME once for the call, then for each key INCR of
-- <key>:<window number> and PEXPIRE when the key is new, exactly as the one-key
-- script does. It returns the counts, in the order of KEYS, and leaves the comparison
-- with the limit to the caller. What a decision costs Redis when calls carry many
-- decisions and do nothing else: the least a batched store can reach.
--
-- KEYS[i]  subject i's key base; the window number is appended to it
-- ARGV[1]  window_ms
local t = redis.call("TIME")
local w = tonumber(ARGV[1])
local suffix = ":" .. math.floor((t[1] * 1000 + math.floor(t[2] / 1000)) / w)
local counts = {}
for i = 1, #KEYS do
  local key = KEYS[i] .. suffix
  local count = redis.call("INCR", key)
  if count == 1 then
    redis.call("PEXPIRE", key, w)
  end
  counts[i] = count
end
return counts
