-- wrk: GET /api/hello of examples/quickstart with an x-api-key drawn from 100,000 at random;
-- counts the 200s that carry no RateLimit header (let through undecided: fail-open).
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
  undecided = 0
  limited = 0
  other = 0
end
function request()
  return wrk.format("GET", "/api/hello", { ["x-api-key"] = "key-" .. math.random(1, 100000) })
end
function response(status, headers, body)
  if status == 429 then
    limited = limited + 1
  elseif status ~= 200 then
    other = other + 1
  elseif headers["ratelimit"] == nil and headers["RateLimit"] == nil then
    undecided = undecided + 1
  end
end
function done(summary, latency, requests)
  local u, l, o = 0, 0, 0
  for _, t in ipairs(threads) do
    u = u + t:get("undecided"); l = l + t:get("limited"); o = o + t:get("other")
  end
  local n = summary.requests
  io.write(string.format("answers %d  undecided %d (%.3f%%)  429 %d  other %d  errors c%d r%d w%d t%d\n",
    n, u, 100 * u / math.max(n, 1), l, o, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.timeout))
end
