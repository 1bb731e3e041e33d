-- the common token bucket layout (our own code, for comparison only): a hash with the
-- tokens left and the time of the last refill.
--
-- KEYS[1]  the bucket's key
-- ARGV     clock ("s" for Redis TIME, or ms), cost, capacity, refill period (ms to
--          refill from empty)
-- Reply    allowed (0/1), tokens left, ms until full, retry after (ms)
local now = tonumber(ARGV[1])
if ARGV[1] == "s" then
  local t = redis.call("TIME")
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local cost, capacity, period = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rate = capacity / period -- tokens per ms
local state = redis.call("HMGET", KEYS[1], "tokens", "ts")
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
if now > ts then
  tokens = math.min(capacity, tokens + (now - ts) * rate)
end
local allowed = 0
local retry = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry = math.ceil((cost - tokens) / rate)
end
redis.call("HSET", KEYS[1], "tokens", tokens, "ts", now)
redis.call("PEXPIRE", KEYS[1], 2 * period)
return { allowed, math.floor(tokens), math.ceil((capacity - tokens) / rate), retry }
