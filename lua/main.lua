-- redlimit: decide every policy of one subject in one call, all or nothing.
--
-- The store puts a line before this file: `local op, first = "c", 2` in the
-- check's script, `local op, first = ARGV[2], 3` in the admin operations' one.
--
-- KEYS[i]              the state key of policy i (all in the subject's hash tag)
-- ARGV[1]              the cost of the request
-- ARGV[2]              admin script only: p (peek), r (refund) or x (reset)
-- ARGV[first + 3(i-1)] algorithm of policy i: fw, sw, tb or sl
--     [first + 3(i-1) + 1] limit (capacity of a token bucket) of policy i,
--                      negative for a shadow policy (decides, never denies)
--     [first + 3(i-1) + 2] window in ms of policy i; for a token bucket its
--                      emission interval in us
-- ARGV[first + 3n]     optional: the client's clock in ms; without it, Redis TIME
--
-- Reply: per policy, allowed (0/1), remaining, reset after (ms), retry after (ms).
-- A check decides every policy before any state is written, and writes policy
-- i only if it admits and every enforced (non-shadow) policy admits: enforced
-- policies are all or nothing, a shadow one consumes when enforcing it would
-- have. Every check write sets a TTL of the time its state needs.
--
-- The admin operations run the same per-algorithm code: a peek decides and
-- writes nothing; a refund gives back the cost (the algorithm's refund
-- function; the state only shrinks, so its key keeps its TTL) then answers as a
-- peek; a reset deletes the keys then answers as a peek on fresh state.
--
-- The crate is this script's only caller and builds every policy and cost
-- valid (positive integers whose products stay below 2^53, a cost no policy
-- exceeds), so a call checks only what is cheap: the number of arguments, known
-- algorithms and operation, numbers where numbers go. Everything else a call
-- does is its decision. A script with another argument layout has another
-- SHA-1, so instances of an older release keep calling their own script on the
-- same state.

local nkeys = #KEYS
local clock_at = first + 3 * nkeys
local nargs = #ARGV
if nkeys == 0 or nargs < clock_at - 1 or nargs > clock_at then
  return redis.error_reply(string.format(
    "ERR redlimit: expected one key per policy, then %d arguments (cost%s, 3 per policy, optional clock), got %d keys and %d arguments",
    clock_at - 1, first == 3 and ", operation" or "", nkeys, nargs))
end
local now
if nargs == clock_at then
  now = tonumber(ARGV[clock_at])
else
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end
local cost = tonumber(ARGV[1])
if not (now and cost) or not (op == "c" or op == "p" or op == "r" or op == "x") then
  return redis.error_reply(string.format(
    "ERR redlimit: expected the cost, an operation (p, r or x) and the clock in ms, got %q, %q and %q",
    string.sub(ARGV[1], 1, 24), string.sub(op, 1, 8), string.sub(ARGV[clock_at] or "(Redis TIME)", 1, 24)))
end

if op == "x" then
  redis.call("DEL", unpack(KEYS))
end

-- Decide every policy before writing anything. The tables start at the size of
-- one policy's: growing them from empty costs a visible share of a call.
local reply, writes, all = { 0, 0, 0, 0 }, { false, false }, true
for i = 1, nkeys do
  local at = first + 3 * (i - 1)
  local decide = DECIDE[ARGV[at]]
  local limit, n = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  if not (decide and limit and n) then
    local known = {}
    for code in pairs(DECIDE) do
      known[#known + 1] = code
    end
    table.sort(known)
    return redis.error_reply(string.format(
      "ERR redlimit: policy %d must be one of this script's algorithms (%s) with a limit and a window or interval, got %q, %q and %q",
      i, table.concat(known, ", "), string.sub(ARGV[at], 1, 8), string.sub(ARGV[at + 1], 1, 24),
      string.sub(ARGV[at + 2], 1, 24)))
  end
  local shadow = limit < 0
  if shadow then
    limit = -limit
  end
  local raw = false
  if op ~= "x" then
    raw = redis.call("GET", KEYS[i])
  end
  if op == "r" and raw then
    local given_back = REFUND[ARGV[at]](limit, n, now, cost, raw)
    if given_back then
      redis.call("SET", KEYS[i], given_back, "KEEPTTL")
      raw = given_back
    end
  end
  local allowed, remaining, reset, retry, ttl, nxt = decide(limit, n, now, cost, raw)
  local base = 4 * (i - 1)
  if allowed then
    reply[base + 1] = 1
    writes[i] = nxt
    writes[nkeys + i] = ttl
  else
    reply[base + 1] = 0
    if not shadow then
      all = false
    end
  end
  reply[base + 2] = remaining
  reply[base + 3] = reset
  reply[base + 4] = retry
end

if op == "c" and all then
  for i = 1, nkeys do
    local nxt = writes[i]
    if nxt then
      local ttl = math.max(writes[nkeys + i], 1)
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
