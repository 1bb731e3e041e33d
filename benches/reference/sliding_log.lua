-- the common sliding log layout (our own code, for comparison only): every admitted
-- request's timestamp in a sorted set; ZREMRANGEBYSCORE drops those older than the
-- window, ZCARD counts the rest, ZADD records the new one.
--
-- KEYS[1]  the log's key
-- ARGV     clock ("s" for Redis TIME, or ms), cost, limit, window_ms, request id
--          (members must be unique: "<ms>-<request id>", and "-<i>" for a cost above 1)
-- Reply    allowed (0/1), remaining, reset after (ms), retry after (ms)
local now = tonumber(ARGV[1])
if ARGV[1] == "s" then
  local t = redis.call("TIME")
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local cost, limit, w = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - w)
local count = redis.call("ZCARD", KEYS[1])
if count + cost > limit then
  local oldest = redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
  return { 0, 0, w, tonumber(oldest[2]) + w - now }
end
local member = string.format("%d", now) .. "-" .. ARGV[5]
if cost == 1 then
  redis.call("ZADD", KEYS[1], now, member)
else
  local args = {}
  for i = 1, cost do
    args[#args + 1] = now
    args[#args + 1] = member .. "-" .. i
    if #args >= 1000 or i == cost then
      redis.call("ZADD", KEYS[1], unpack(args))
      args = {}
    end
  end
end
redis.call("PEXPIRE", KEYS[1], w)
return { 1, limit - count - cost, w, 0 }
