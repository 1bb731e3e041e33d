-- The smallest script that makes a fixed-window decision at all (our own code, the
-- reference): Redis TIME, INCR of a key per window, PEXPIRE when the key is
-- new. It returns the count and leaves the comparison with the limit to the caller.
--
-- KEYS[1]  the subject's key base; the window number is appended to it
-- ARGV[1]  window_ms
local t = redis.call("TIME")
local w = tonumber(ARGV[1])
local key = KEYS[1] .. ":" .. math.floor((t[1] * 1000 + math.floor(t[2] / 1000)) / w)
local count = redis.call("INCR", key)
if count == 1 then
  redis.call("PEXPIRE", key, w)
end
return count
