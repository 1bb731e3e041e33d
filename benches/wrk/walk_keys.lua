-- wrk: every request carries the next of 100,000 API keys in the x-api-key header, as
-- the tables bench's own generator sends them (key-000000 to key-099999, in turn), so
-- that every request starts its key's window. Used by `REDLIMIT_HTTP_LOAD=wrk cargo
-- bench -p redlimit-bench --bench tables -- http`.
local next_key = 0
function request()
  next_key = (next_key + 1) % 100000
  return wrk.format("GET", "/", { ["x-api-key"] = string.format("key-%06d", next_key) })
end
