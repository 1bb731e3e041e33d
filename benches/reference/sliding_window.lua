-- the common sliding window counter layout (our own code, for comparison only): two
-- counters, one key per window; estimate = previous x (1 - elapsed fraction) + current.
--
-- KEYS[1]  the subject's key base; the window numbers are appended to it
-- ARGV     clock ("s" for Redis TIME, or ms), cost, limit, window_ms
-- Reply    allowed (0/1), remaining, reset after (ms), retry after (ms)
local now = tonumber(ARGV[1])
if ARGV[1] == "s" then
  local t = redis.call("TIME")
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local cost, limit, w = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local window = math.floor(now / w)
local elapsed = now - window * w
local cur_key = KEYS[1] .. ":" .. string.format("%d", window)
local prev_key = KEYS[1] .. ":" .. string.format("%d", window - 1)
local prev = tonumber(redis.call("GET", prev_key) or "0")
local cur = tonumber(redis.call("GET", cur_key) or "0")
local estimate = prev * (w - elapsed) / w + cur
if estimate + cost > limit then
  return { 0, 0, w - elapsed, w - elapsed }
end
redis.call("INCRBY", cur_key, cost)
redis.call("PEXPIRE", cur_key, 2 * w)
return { 1, math.floor(limit - estimate - cost), 2 * w - elapsed, 0 }
