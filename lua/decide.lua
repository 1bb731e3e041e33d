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

-- Decides the n policies of one subject before writing anything: policy i's key
-- is keys[k0 + i], its arguments args[a0 + 3(i-1)] .. args[a0 + 3(i-1) + 2] (code,
-- limit, window or interval), its four reply integers reply[r0 + 4(i-1) + 1..4].
-- Sets writes[i] (the state to write, false for none) and writes[n + i] (its
-- TTL); raws[i] keeps the state read, when raws is a table. A refund (op "r")
-- gives the cost back first; a reset (op "x") reads nothing. Returns whether
-- every enforced policy admits, or nil and the error.
local function decide_policies(keys, k0, n, args, a0, op, now, cost, reply, r0, writes, raws)
  local all = true
  for i = 1, n do
    local at = a0 + 3 * (i - 1)
    local code = args[at]
    local decide = DECIDE[code]
    local limit, window = tonumber(args[at + 1]), tonumber(args[at + 2])
    if not (decide and limit and window) then
      return nil, bad_policy(i, code, args[at + 1], args[at + 2])
    end
    local shadow = limit < 0
    if shadow then
      limit = -limit
    end
    local key = keys[k0 + i]
    local raw = false
    if op ~= "x" then
      raw = redis.call("GET", key)
    end
    if raws then
      raws[i] = raw
    end
    if op == "r" and raw then
      local given_back = REFUND[code](limit, window, now, cost, raw)
      if given_back then
        redis.call("SET", key, given_back, "KEEPTTL")
        raw = given_back
      end
    end
    local allowed, remaining, reset, retry, ttl, nxt = decide(limit, window, now, cost, raw)
    local base = r0 + 4 * (i - 1)
    if allowed then
      reply[base + 1] = 1
      writes[i] = nxt
      writes[n + i] = ttl
    else
      reply[base + 1] = 0
      writes[i] = false
      if not shadow then
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
          redis.call("SETRANGE", key, int(nxt[j]), nxt[j + 1])
        end
        redis.call("PEXPIRE", key, int(ttl))
      else
        redis.call("SET", key, nxt, "PX", int(ttl))
      end
    end
  end
end
