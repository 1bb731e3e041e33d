-- the common fixed window layout (our own code, for comparison only): one INCR on a
-- key that embeds the window number, PEXPIRE of two windows on the first hit.
--
-- KEYS[1]  the subject's key base; the window number is appended to it
-- ARGV     clock ("s" for Redis TIME, or ms), cost, limit, window_ms
-- Reply    allowed (0/1), remaining, reset after (ms), retry after (ms)
local now = tonumber(ARGV[1])
if ARGV[1] == "s" then
  local t = redis.call("TIME")
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local cost, limit, w = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local window = math.floor(now / w)
local key = KEYS[1] .. ":" .. string.format("%d", window)
local count = redis.call("INCRBY", key, cost)
if count == cost then
  redis.call("PEXPIRE", key, 2 * w)
end
local reset = (window + 1) * w - now
if count > limit then
  return { 0, 0, reset, reset }
end
return { 1, limit - count, reset, 0 }
