-- Fixed window: one counter per window aligned to the epoch.
-- Translation of decide in src/algorithm/fixed_window.rs.
-- State: the window's index and its count, packed ">I6I6" (12 bytes: a Redis 7
-- string value of up to 12 bytes costs no more memory than an empty one), or
-- ">I7I7" when either reaches 2^48.

local function fixed_window_read(raw)
  if raw then
    local len = #raw
    if len == 12 then
      local idx, count = sunpack(">I6I6", raw)
      return idx, count, nil, idx
    elseif len == 14 then
      local idx, count = sunpack(">I7I7", raw)
      return idx, count, nil, idx
    end
  end
  return nil
end

-- The decision at `now`: in the stored window when it is the current one, or up
-- to MAX_BACK windows ahead (a clock that went back: stay in the stored window);
-- further ahead, it is state this clock cannot have written, read as fresh. The
-- refund and the charge read the window the same way: this with a cost of 0.
local function fixed_window_step(limit, w, now, cost, idx, count)
  -- The window now is in, as common.lua's WINDOW_AT keeps it.
  local cur = WINDOW_AT_INDEX
  if now ~= WINDOW_AT_NOW or w ~= WINDOW_AT_W then
    cur = (now - fmod(now, w)) / w
    WINDOW_AT_NOW, WINDOW_AT_W, WINDOW_AT_INDEX = now, w, cur
  end
  if not idx or idx < cur or idx > cur + MAX_BACK then
    idx, count = cur, 0
  end
  -- Counted from the time asked: a clock that went back waits out the stored window
  -- too (the store decides on its stored time, the caller waits on its own clock).
  local reset = (idx + 1) * w - now
  if count + cost <= limit then
    count = count + cost
    return true, limit - count, reset, 0, idx, count
  end
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  return false, remaining, reset, reset, idx, count
end

-- The last state packed and its bytes: a call's new subjects of one window all
-- start at the same count, and pack is a visible share of their decisions.
local FW_IDX, FW_COUNT, FW_RAW = -1, -1, ""

-- Kept to the window's end: a state written in the stored window keeps its TTL.
local function fixed_window_encode(w, now, idx, count, _, keep)
  if idx ~= FW_IDX or count ~= FW_COUNT then
    if idx < WIDE_AT and count < WIDE_AT then
      FW_RAW = pack(">I6I6", idx, count)
    else
      FW_RAW = pack(">I7I7", idx, count)
    end
    FW_IDX, FW_COUNT = idx, count
  end
  return FW_RAW, (idx + 1) * w - now, keep == true or keep == idx
end

READ[ALG_FIXED_WINDOW], STEP[ALG_FIXED_WINDOW], ENCODE[ALG_FIXED_WINDOW] =
  fixed_window_read, fixed_window_step, fixed_window_encode
