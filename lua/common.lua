-- redlimit: helpers shared by the four algorithms. The store concatenates
-- common.lua, the files of the algorithms a limiter's policies use (of
-- fixed_window.lua, sliding_window.lua, token_bucket.lua and sliding_log.lua,
-- in that order) and main.lua into one script per call shape: every call
-- defines the functions of its script, so a limiter pays only for its own
-- algorithms. Each algorithm file registers its decide function in DECIDE;
-- the part of it after its "-- admin:" line (the refund function, registered in
-- REFUND) goes only into the scripts of the admin operations, so a check does
-- not define what it never runs.
--
-- Lua numbers are doubles: every integer below stays under 2^53 (the policies
-- are checked for that), where doubles are exact.

-- The algorithms of this script by code: their decide functions (REFUND, their
-- refund functions, exists in the admin operations' scripts only).
local DECIDE = {}

-- How many windows (a token bucket: fill times) a clock may go back and still
-- decide on the stored state: MAX_CLOCK_BACK in src/algorithm/mod.rs. State
-- further ahead of the clock is foreign and read as fresh.
local MAX_BACK = 4

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

-- A non-negative integer below 2^53 as decimal text. Lua's own number-to-string
-- conversion keeps only 14 significant digits, so never let it format a state or
-- an argument. "%.0f" would be exact too, but glibc formats a double through
-- multi-precision arithmetic, several times slower than "%d"; "%d" converts to a
-- C long, which may be 32 bits, so larger values go as two halves of 8 digits.
local function int(n)
  if n < 100000000 then
    return string.format("%d", n)
  end
  local high = idiv(n, 100000000)
  return string.format("%d%08d", high, n - high * 100000000)
end

-- A stored decimal field, or nil when it is not one.
local function field(s)
  if s == nil or #s > 16 then
    return nil
  end
  local n = tonumber(s)
  if n == nil or n >= 9007199254740992 then
    return nil
  end
  return n
end
