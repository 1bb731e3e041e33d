-- redlimit: helpers every composition starts with. src/store/redis/script.rs
-- composes the function library and the scripts from lua/; the Lua reads the
-- constants of src/store/redis/contract by name (OP_*, ARG_*, HEAD_*, FLAG_*,
-- PACK_*, LEASE_*, ALG_*, MAX_BACK, MAX_DEBT, CALENDAR_MAX_AHEAD, ...), and the
-- composed code has their values in place of the names (read as locals they cost
-- every call instructions); the library starts with the preamble generated from
-- them. Then comes this file, then the algorithms a call needs (fixed_window.lua,
-- sliding_window.lua, token_bucket.lua, sliding_log.lua, in_flight.lua and
-- calendar.lua, in that order; each followed by its *_refund.lua and *_charge.lua
-- only where units are given back or charged), then decide.lua, lease.lua only
-- where a leasing check runs, and the entry point: batch.lua (checks and the
-- operations that batch with them) or main.lua (a reset, a leasing check, a
-- give-back).
--
-- Each algorithm is three functions, registered by its code:
--   READ[code](raw) -> a, b, c, keep
--       its state as numbers (or the string the algorithm works on), nil for no
--       state or bytes it did not write; `keep` names the stored state's TTL (see
--       ENCODE), false when a write must set its own.
--   STEP[code](limit, n, now, cost, a, b, c, peek) -> allowed, remaining, reset, retry, a, b, c
--       the decision at `now` (ms) for `cost` on a state read or left by an earlier
--       decision of the same call, and the state after it: a pure function of its
--       arguments, so a subject's state is parsed once however many checks of one
--       call decide on it. `peek`: nothing will be written (in flight and the
--       sliding log then build no new state).
--   ENCODE[code](n, now, a, b, c, keep) -> raw, ttl, kept
--       the state as the bytes to store (nil: no state, the key goes), the TTL in
--       ms it needs from `now`, and whether the key's TTL may be kept: keep == true
--       (a refund: the state only shrank) or keep equal to the new state's own (the
--       stored state's TTL already runs to where this one's must). Keeping costs
--       Redis less than setting one. `store` writes what it returns (its body is
--       in place where a decision writes); a joint set's writer joins its
--       policies' (decide.lua).
-- `n` is the policy's window in ms (a token bucket: its emission interval in us;
-- a calendar quota: the end of its period in ms; in flight: the slot lifetime),
-- `limit` positive. The refund and charge files register REFUND[code] and
-- CHARGE[code](limit, n, now, cost, a, b, c) -> a, b, c (nil: nothing to change).
--
-- Lua numbers are doubles: every integer below stays under 2^53 (the policies
-- are checked for that), where doubles are exact.

local READ, STEP, ENCODE = {}, {}, {}

-- The library functions the code calls, as upvalues: a function library cannot
-- reach the standard libraries while it loads, and an upvalue costs less than a
-- global table's lookup on every use. Read by init(), at the start of every call
-- that finds them unset (once per loaded library; every call of a script).
local fmod, floor, min, max, fmt, byte, sub, find, rep, gmatch, char
local pack, sunpack, call, try_call, tonum, unpacked, concat
-- The batchable operations by their letter's byte (a batch's records name them so).
local OP_OF
-- Whether a new key's expiry on Redis TIME goes as the time it ends (see ttl_text).
local ABSOLUTE_EXPIRY
local function init()
  fmod, floor, min, max = math.fmod, math.floor, math.min, math.max
  fmt, byte, sub, find, rep = string.format, string.byte, string.sub, string.find, string.rep
  gmatch, char = string.gmatch, string.char
  pack, sunpack, call, tonum, unpacked, concat = struct.pack, struct.unpack, redis.call, tonumber, unpack, table.concat
  -- redis.pcall: an error comes back as a value (a table) instead of ending the call.
  try_call = redis.pcall
  ABSOLUTE_EXPIRY = (redis.REDIS_VERSION_NUM or 0) >= 0x080000
  OP_OF = {}
  for _, op in ipairs({ OP_CHECK, OP_PEEK, OP_REFUND, OP_CHARGE, OP_RELEASE, OP_RENEW }) do
    OP_OF[byte(op)] = op
  end
end

-- Floor division of non-negative integers, exact: fmod is exact in IEEE
-- arithmetic, so a - fmod(a, b) is an exact multiple of b.
local function idiv(a, b)
  return (a - fmod(a, b)) / b
end

-- Ceiling division of non-negative integers (u64::div_ceil).
local function cdiv(a, b)
  local q = (a - fmod(a, b)) / b
  if q * b < a then
    q = q + 1
  end
  return q
end

-- 2^48: the packed states keep their integers in 6 bytes below it, in 7 above.
local WIDE_AT = 281474976710656

-- A non-negative integer below 2^53 as decimal text. Lua's own number-to-string
-- conversion keeps only 14 significant digits, so never let it format a state.
-- "%d" converts to a C long, 64 bits on every 64-bit build of Redis; on others,
-- larger values go as two halves of 8 digits.
local WIDE_LONG
local function int(n)
  if WIDE_LONG == nil then
    WIDE_LONG = fmt("%d", 9007199254740991) == "9007199254740991"
  end
  if n < 100000000 or WIDE_LONG then
    return fmt("%d", n)
  end
  local high = idiv(n, 100000000)
  return fmt("%d%08d", high, n - high * 100000000)
end

-- WINDOW_AT: the last window index a window's step worked out, floor(now / w), for
-- the now and w it was worked out at. A call's decisions share one now (Redis TIME)
-- and mostly one window length: the fixed and sliding windows' steps test it in place
-- and divide only when now or w differ.
local WINDOW_AT_NOW, WINDOW_AT_W, WINDOW_AT_INDEX = -1, -1, -1

-- A TTL in ms (at least 1) as the text SET takes: a number passed to redis.call is
-- formatted with "%.17g", and a call's writes on one clock mostly set the same few
-- TTLs (one a policy), so the last two are kept. Writers test the last one in place
-- (`ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl)`): a call is a visible share of a
-- decision, and a batch's writes on one clock mostly hit it.
local TTL_A, TTL_A_TEXT, TTL_B, TTL_B_TEXT = -1, "", -1, ""
local function ttl_text(ms)
  if ms == TTL_A then
    return TTL_A_TEXT
  elseif ms == TTL_B then
    return TTL_B_TEXT
  end
  if ms < 1 then
    ms = 1
  end
  TTL_B, TTL_B_TEXT, TTL_A, TTL_A_TEXT = TTL_A, TTL_A_TEXT, ms, int(ms)
  return TTL_A_TEXT
end

-- A key the call read as absent is written with SET's GET option, in place:
--   if old or try_call("SET", key, raw, "PX", px, "GET") then call("SET", key, raw, "PX", px) end
-- Its reply is then nil (false in Lua), where SET's own "OK" is a status that Redis
-- turns into a new table for Lua: about 900 of a new subject's Redis instructions on
-- Redis 8.2, 400 on 7.0 (BENCHMARKS.md). A key read as a string keeps the plain SET: GET would
-- send its old value back, which costs more than the status. MGET reads a key of
-- another type as absent, and GET fails on it; the error comes back as a table, and
-- the plain SET overwrites the key, as it always did.
-- On Redis 8 and Redis TIME, a new key's expiry goes as the time it ends (PXAT now +
-- ttl, through the same text cache: a batch's states of one window end together).
-- Redis 8.2 rewrites a relative one (PX) into that form for its replicas and its
-- AOF, at about 1,900 instructions a write; on 7.0.15 a SET with PXAT costs more
-- than one with PX (BENCHMARKS.md), so Redis 7 (and a server too old to tell its
-- version) keeps PX. The key ends when the state's TTL says, on the clock the state
-- was decided on. On the client's clock the TTL stays relative: Redis's own clock
-- may differ from it.

-- Writes what an ENCODE returned to `key`.
local function store(key, raw, ttl, kept)
  if not raw then
    call("DEL", key)
  elseif kept then
    call("SET", key, raw, "KEEPTTL")
  else
    call("SET", key, raw, "PX", ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl))
  end
end

-- Redis TIME in ms: its two fields are always digits.
local function time_ms()
  local t = call("TIME")
  return t[1] * 1000 + idiv(t[2] + 0, 1000)
end

-- One policy's outcome into the reply at reply[r + 1 ..]; returns the new end.
-- Usually one integer: ((reset * 2^PACK_REMAINING_BITS + remaining) * 2 + allowed),
-- and a denial's retry after it; when remaining or reset do not fit their bits,
-- PACK_WIDE_DENIED or PACK_WIDE_ALLOWED, then remaining, reset and retry.
local function put(reply, r, allowed, remaining, reset, retry)
  if remaining < PACK_REMAINING_LIMIT and reset < PACK_RESET_LIMIT then
    local v = (reset * PACK_REMAINING_LIMIT + remaining) * 2
    if allowed then
      reply[r + 1] = v + 1
      return r + 1
    end
    reply[r + 1], reply[r + 2] = v, retry
    return r + 2
  end
  reply[r + 1] = allowed and PACK_WIDE_ALLOWED or PACK_WIDE_DENIED
  reply[r + 2], reply[r + 3], reply[r + 4] = remaining, reset, retry
  return r + 4
end

-- The reply's first r integers as one string of big-endian doubles, 8 bytes each
-- (exact: every integer of a reply is below 2^53). Redis turns a table into a reply
-- at a cost per table and per item, and the client parses a reply integer by integer
-- (about 1,700 instructions each) where it reads one string at once (BENCHMARKS.md).
-- Packed 32 at a time: a format of its own per count, and no more values unpacked
-- onto the stack.
local PACKED = {}
local function packed_run(reply, i, j)
  local count = j - i + 1
  local format = PACKED[count]
  if not format then
    format = ">" .. rep("d", count)
    PACKED[count] = format
  end
  return pack(format, unpacked(reply, i, j))
end
local function packed(reply, r)
  if r <= 32 then
    return packed_run(reply, 1, r)
  end
  local runs = {}
  for i = 1, r, 32 do
    runs[#runs + 1] = packed_run(reply, i, min(i + 31, r))
  end
  return concat(runs)
end
