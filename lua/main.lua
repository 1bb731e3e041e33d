-- redlimit: decide every policy of one subject in one call, all or nothing.
--
-- KEYS[i]            the state key of policy i (all in the subject's hash tag)
-- ARGV[1]            the clock: "s" to read Redis TIME, or milliseconds
-- ARGV[2]            the cost of the request
-- ARGV[3]            the operation: c (check), p (peek), r (refund), x (reset)
-- ARGV[4 + 5(i-1)]   algorithm of policy i: fw, sw, tb or sl
-- ARGV[5 + 5(i-1)]   limit (capacity of a token bucket) of policy i
-- ARGV[6 + 5(i-1)]   window in ms of policy i
-- ARGV[7 + 5(i-1)]   emission interval in us of policy i (token bucket; else 0)
-- ARGV[8 + 5(i-1)]   1 if policy i is a shadow (decides, never denies), else 0
--
-- Reply: per policy, allowed (0/1), remaining, reset after (ms), retry after (ms).
-- A check decides every policy before any state is written, and writes policy
-- i only if it admits and every enforced (non-shadow) policy admits: enforced
-- policies are all or nothing, a shadow one consumes when enforcing it would
-- have. Every check write sets a TTL of the time its state needs.
--
-- The admin operations run the same per-algorithm code: a peek decides and
-- writes nothing; a refund gives back the cost (the algorithm's _refund
-- function; the state only shrinks, so its key keeps its TTL) then answers as a
-- peek; a reset deletes the keys then answers as a peek on fresh state.

local EXACT = 9007199254740992 -- 2^53
local MAX_CLOCK = 9000000000000 -- ms; now * 1000 (us) must stay exact
local MAX_LOG = 100000 -- sliding log stamps, as MAX_SLIDING_LOG_LIMIT in Rust
local PER_POLICY = 5
local OPERATIONS = { c = true, p = true, r = true, x = true }

local nkeys = #KEYS
if nkeys == 0 then
  return redis.error_reply("ERR redlimit: KEYS must hold one state key per policy, got none")
end
if #ARGV ~= 3 + PER_POLICY * nkeys then
  return redis.error_reply(string.format(
    "ERR redlimit: ARGV must hold 3 + 5 x %d = %d arguments (clock, cost, operation, then 5 per policy), got %d",
    nkeys, 3 + PER_POLICY * nkeys, #ARGV))
end

local problem = nil
-- ARGV[i] as an integer >= min, or 0 after noting what is wrong with it: its
-- name, then " of policy <policy>" when given, joined only on failure (this runs
-- on every call).
local function argument(i, what, min, policy)
  local s = ARGV[i]
  local n = nil
  if #s <= 16 and string.match(s, "^%d+$") then
    n = tonumber(s)
  end
  if n == nil or n >= EXACT or n < min then
    local kind = "a non-negative integer"
    if min > 0 then
      kind = "a positive integer"
    end
    if policy then
      what = what .. " of policy " .. policy
    end
    problem = problem or string.format(
      "ERR redlimit: ARGV[%d] (%s) must be %s below 2^53, got %q", i, what, kind, string.sub(s, 1, 32))
    return 0
  end
  return n
end
local function fail(i, what, rule)
  problem = problem or string.format("ERR redlimit: ARGV[%d] (%s) %s", i, what, rule)
end

local now
if ARGV[1] == "s" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
else
  now = argument(1, "clock", 0)
  if now > MAX_CLOCK then
    fail(1, "clock", "must be \"s\" or milliseconds up to " .. int(MAX_CLOCK))
  end
end
local cost = argument(2, "cost", 1)
local op = ARGV[3]
if not OPERATIONS[op] then
  fail(3, "operation", "must be c, p, r or x, got " .. string.format("%q", string.sub(op, 1, 32)))
end

local policies = {}
for i = 1, nkeys do
  local at = 4 + PER_POLICY * (i - 1)
  local code = ARGV[at]
  local algorithm = ALGORITHMS[code]
  if algorithm == nil then
    algorithm = {}
    local known = {}
    for name in pairs(ALGORITHMS) do
      known[#known + 1] = name
    end
    table.sort(known)
    fail(at, "algorithm of policy " .. i, "must be one of this script's algorithms ("
      .. table.concat(known, ", ") .. "), got " .. string.format("%q", string.sub(code, 1, 32)))
  end
  local limit = argument(at + 1, "limit", 1, i)
  local window = argument(at + 2, "window_ms", 1, i)
  local emission = 0
  if code == "tb" then
    emission = argument(at + 3, "emission_us", 1, i)
    if limit * emission >= EXACT then
      fail(at + 3, "emission_us of policy " .. i, "times the capacity must stay below 2^53")
    end
  else
    argument(at + 3, "emission_us", 0, i)
    if limit * window >= EXACT then
      fail(at + 2, "window_ms of policy " .. i, "times the limit must stay below 2^53")
    end
  end
  if code == "sl" and limit > MAX_LOG then
    fail(at + 1, "limit of policy " .. i, "of a sliding log must be at most " .. MAX_LOG)
  end
  if cost > limit then
    fail(2, "cost", "must not exceed the limit of policy " .. i .. " (" .. int(limit) .. ")")
  end
  local shadow = ARGV[at + 4]
  if shadow ~= "0" and shadow ~= "1" then
    fail(at + 4, "shadow flag of policy " .. i, "must be 0 or 1, got " .. string.format("%q", string.sub(shadow, 1, 32)))
  end
  policies[i] = { algorithm[1], limit, window, emission, shadow == "1", algorithm[2] }
end
if problem then
  return redis.error_reply(problem)
end

if op == "x" then
  redis.call("DEL", unpack(KEYS))
end

-- Decide every policy before writing anything.
local reply, writes, all = {}, {}, true
for i = 1, nkeys do
  local p = policies[i]
  local raw = false
  if op ~= "x" then
    raw = redis.call("GET", KEYS[i])
  end
  if op == "r" and raw then
    local given_back = p[6](p[2], p[3], p[4], now, cost, raw)
    if given_back then
      redis.call("SET", KEYS[i], given_back, "KEEPTTL")
      raw = given_back
    end
  end
  local allowed, remaining, reset, retry, ttl, nxt = p[1](p[2], p[3], p[4], now, cost, raw)
  local at = 4 * (i - 1)
  if allowed then
    reply[at + 1] = 1
  else
    reply[at + 1] = 0
    if not p[5] then
      all = false
    end
  end
  reply[at + 2] = remaining
  reply[at + 3] = reset
  reply[at + 4] = retry
  if allowed then
    writes[i] = { nxt, math.max(ttl, 1) }
  end
end

if op == "c" and all then
  for i = 1, nkeys do
    local write = writes[i]
    if write then
      local nxt, ttl = write[1], write[2]
      if type(nxt) == "table" then
        for j = 1, #nxt, 2 do
          redis.call("SETRANGE", KEYS[i], int(nxt[j]), nxt[j + 1])
        end
        redis.call("PEXPIRE", KEYS[i], int(ttl))
      else
        redis.call("SET", KEYS[i], nxt, "PX", int(ttl))
      end
    end
  end
end
return reply
