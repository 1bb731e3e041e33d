-- redlimit: deciding one subject's policies and writing what they admit, shared
-- by the single call (main.lua) and the batch (batch.lua).

-- The error of a policy whose arguments are not one of this script's algorithms
-- with a limit and a window or interval.
local function bad_policy(i, code, limit, n)
  local known = {}
  for c in pairs(DECIDE) do
    known[#known + 1] = c
  end
  table.sort(known)
  return string.format(
    "ERR redlimit: policy %d must be one of this script's algorithms (%s) with a limit and a window or interval, got %q, %q and %q",
    i, table.concat(known, ", "), string.sub(code or "", 1, 8), string.sub(limit or "", 1, 24),
    string.sub(n or "", 1, 24))
end

-- The n policies whose arguments start at args[a0] (3 each: code, limit,
-- window or interval), read once into one flat table: policy i's decide
-- function, limit, window, shadow flag and code at 5(i-1) + 1..5. Or nil and
-- the error.
local function read_policies(args, a0, n)
  -- Sized for one policy: growing a table from empty costs a visible share of a
  -- call.
  local set = { false, false, false, false, false }
  for i = 1, n do
    local at = a0 + 3 * (i - 1)
    local code = args[at]
    local decide = DECIDE[code]
    local limit, window = tonumber(args[at + 1]), tonumber(args[at + 2])
    if not (decide and limit and window) then
      return nil, bad_policy(i, code, args[at + 1], args[at + 2])
    end
    -- A shadow policy's limit comes negative: it decides, never denies.
    local shadow = limit < 0
    if shadow then
      limit = -limit
    end
    local b = 5 * (i - 1)
    set[b + 1], set[b + 2], set[b + 3], set[b + 4], set[b + 5] = decide, limit, window, shadow, code
  end
  return set
end

-- Decides the policies of one subject (a table of read_policies) before writing
-- anything: policy i's key is keys[k0 + i], its four reply integers
-- reply[r0 + 4(i-1) + 1..4]. Sets writes[i] (the state to write, false for
-- none) and writes[n + i] (its TTL); raws[i] keeps the state read, when raws is
-- a table. A refund (op "r") gives the cost back first; a reset (op "x") reads
-- nothing. Returns whether every enforced policy admits.
local function decide_policies(keys, k0, set, op, now, cost, reply, r0, writes, raws)
  local all, n = true, #set / 5
  for i = 1, n do
    local b = 5 * (i - 1)
    local limit, window = set[b + 2], set[b + 3]
    local key = keys[k0 + i]
    local raw = false
    if op ~= "x" then
      raw = redis.call("GET", key)
    end
    if raws then
      raws[i] = raw
    end
    if op == "r" and raw then
      local given_back = REFUND[set[b + 5]](limit, window, now, cost, raw)
      if given_back then
        redis.call("SET", key, given_back, "KEEPTTL")
        raw = given_back
      end
    end
    local allowed, remaining, reset, retry, ttl, nxt = set[b + 1](limit, window, now, cost, raw)
    local base = r0 + 4 * (i - 1)
    if allowed then
      reply[base + 1] = 1
      writes[i] = nxt
      writes[n + i] = ttl
    else
      reply[base + 1] = 0
      writes[i] = false
      if not set[b + 4] then
        all = false
      end
    end
    reply[base + 2] = remaining
    reply[base + 3] = reset
    reply[base + 4] = retry
  end
  return all
end

-- Writes the states decide_policies left in writes for keys[k0 + 1 .. k0 + n],
-- each with its TTL: a string is the whole state, a table the ranges to
-- overwrite (offset, bytes, ...) in a state that keeps its length.
local function write_states(keys, k0, n, writes)
  for i = 1, n do
    local nxt = writes[i]
    if nxt then
      local key = keys[k0 + i]
      local ttl = math.max(writes[n + i], 1)
      if type(nxt) == "table" then
        for j = 1, #nxt, 2 do
          redis.call("SETRANGE", key, nxt[j], nxt[j + 1])
        end
        redis.call("PEXPIRE", key, ttl)
      else
        redis.call("SET", key, nxt, "PX", ttl)
      end
    end
  end
end
