-- redlimit: helpers shared by the algorithms. src/store/redis/script.rs
-- composes the function library and the scripts. The Lua reads the constants
-- of src/store/redis/contract by name (the operation letters, argument
-- positions, reply layout and algorithm codes the Rust side encodes and
-- decodes with: OP_*, ARG_*, FIRST_*, POLICY_*, REPLY_*, LEASE_*, BATCH_*,
-- SET_*, ALG_*, MAX_BACK, MAX_DEBT, CALENDAR_MAX_AHEAD); composed, the code has their values in place of the names
-- (read as locals they cost every call instructions), and the library starts
-- with the preamble generated from them. Then comes this file, then the files of the algorithms
-- a call shape needs (of fixed_window.lua, sliding_window.lua,
-- token_bucket.lua, sliding_log.lua, in_flight.lua and calendar.lua, in that order; each followed by its
-- *_refund.lua only where units are given back, and its *_charge.lua only
-- where units are charged), then decide.lua, lease.lua only where a leasing
-- check runs, and the entry point. Each algorithm reads its state in one
-- place its decide, refund and charge functions share: the decide function
-- called without a cost (fixed window, sliding window, token bucket), sl_read,
-- in_flight_live. Every script
-- call defines the functions of its script, so a limiter pays only for its own
-- algorithms, and a check not for refunds or charges. Each algorithm file
-- registers its decide function in DECIDE, each refund file its refund
-- function in REFUND, each charge file its charge function in CHARGE.
--
-- Lua numbers are doubles: every integer below stays under 2^53 (the policies
-- are checked for that), where doubles are exact.

-- The algorithms of this script by code: their decide functions (REFUND, their
-- refund functions, exists in the admin operations' scripts only).
local DECIDE = {}

-- An in-flight holder's release and renewal (in_flight_release.lua), defined only
-- where units and slots are given back.
local IN_FLIGHT_HOLD

-- MAX_BACK (the preamble's, MAX_CLOCK_BACK in src/algorithm/mod.rs): how many
-- windows (a token bucket: fill times) a clock may go back and still decide on
-- the stored state. State further ahead of the clock is foreign, read as fresh.
-- MAX_DEBT (MAX_DEBT in src/algorithm/mod.rs): how many limits (fill times) a
-- charge may leave a subject owing, so that its state is never foreign.

-- Floor division of non-negative integers, exact: fmod is exact in IEEE
-- arithmetic, so a - fmod(a, b) is an exact multiple of b.
local function idiv(a, b)
  return (a - math.fmod(a, b)) / b
end

-- Ceiling division of non-negative integers (u64::div_ceil).
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- Whether "%d" formats every integer below 2^53 in one conversion: Lua's "%d"
-- converts to a C long, 64 bits on every 64-bit build of Redis, 32 on others.
-- Found out by the first call (a function library, when loaded, cannot reach
-- the string library yet).
local WIDE
local function wide()
  if WIDE == nil then
    WIDE = string.format("%d", 9007199254740991) == "9007199254740991"
  end
  return WIDE
end

-- A non-negative integer below 2^53 as decimal text. Lua's own number-to-string
-- conversion keeps only 14 significant digits, so never let it format a state.
-- "%.0f" would be exact too, but glibc formats a double through multi-precision
-- arithmetic, several times slower than "%d"; with a 32-bit C long, larger values
-- go as two halves of 8 digits. (Numbers passed to redis.call as numbers, such as
-- TTLs, are formatted by Redis with 17 digits: exact below 2^53.)
local function int(n)
  if n < 100000000 or wide() then
    return string.format("%d", n)
  end
  local high = idiv(n, 100000000)
  return string.format("%d%08d", high, n - high * 100000000)
end

-- "a:b" (and "a:b:c") of non-negative integers below 2^53, in one conversion
-- where "%d" takes them: every string made costs a call a visible share.
local function ints(a, b, c)
  if wide() then
    if c then
      return string.format("%d:%d:%d", a, b, c)
    end
    return string.format("%d:%d", a, b)
  end
  if c then
    return int(a) .. ":" .. int(b) .. ":" .. int(c)
  end
  return int(a) .. ":" .. int(b)
end

-- A stored decimal field (digits only, as the patterns that capture it
-- match), or nil when it is none or too large to be exact. Read with an
-- arithmetic coercion: tonumber parses the text twice (Lua 5.1 asks whether it
-- is a number, then converts it, each time with strtod), a visible share of a
-- decision.
local function field(s)
  if s == nil or #s > 16 then
    return nil
  end
  local n = s + 0
  if n >= 9007199254740992 then
    return nil
  end
  return n
end

-- Redis TIME in ms: its two fields are always digits.
local function time_ms()
  local t = redis.call("TIME")
  return t[1] * 1000 + idiv(t[2] + 0, 1000)
end
