-- Two policies in one call with the common layouts (our own code, for comparison only):
-- the sliding window's two counters (sliding_window.lua) and the token bucket's hash
-- (token_bucket.lua) of one subject; admitted when both admit, and only then is
-- anything written.
--
-- KEYS[1]  the sliding window's key base (window numbers appended)
-- KEYS[2]  the token bucket's key
-- ARGV     clock ("s" for Redis TIME, or ms), cost, sliding window limit and window_ms,
--          bucket capacity and refill period (ms to refill from empty)
-- Reply    allowed (0/1)
local now = tonumber(ARGV[1])
if ARGV[1] == "s" then
  local t = redis.call("TIME")
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local cost = tonumber(ARGV[2])
local limit, w = tonumber(ARGV[3]), tonumber(ARGV[4])
local capacity, period = tonumber(ARGV[5]), tonumber(ARGV[6])

local window = math.floor(now / w)
local elapsed = now - window * w
local cur_key = KEYS[1] .. ":" .. string.format("%d", window)
local prev_key = KEYS[1] .. ":" .. string.format("%d", window - 1)
local prev = tonumber(redis.call("GET", prev_key) or "0")
local cur = tonumber(redis.call("GET", cur_key) or "0")
local estimate = prev * (w - elapsed) / w + cur

local rate = capacity / period
local state = redis.call("HMGET", KEYS[2], "tokens", "ts")
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
if now > ts then
  tokens = math.min(capacity, tokens + (now - ts) * rate)
end

if estimate + cost > limit or tokens < cost then
  return { 0 }
end
redis.call("INCRBY", cur_key, cost)
redis.call("PEXPIRE", cur_key, 2 * w)
redis.call("HSET", KEYS[2], "tokens", tokens - cost, "ts", now)
redis.call("PEXPIRE", KEYS[2], 2 * period)
return { 1 }
