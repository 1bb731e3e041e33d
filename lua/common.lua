-- redlimit: helpers shared by the four algorithms. The store concatenates
-- common.lua, fixed_window.lua, sliding_window.lua, token_bucket.lua,
-- sliding_log.lua and main.lua, in that order, into one script.
--
-- Lua numbers are doubles: every integer below stays under 2^53 (the policies
-- are checked for that), where doubles are exact.

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

-- An integer as decimal text. Lua's own number-to-string conversion keeps only
-- 14 significant digits, so never let it format a state or an argument.
local function int(n)
  return string.format("%.0f", n)
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
