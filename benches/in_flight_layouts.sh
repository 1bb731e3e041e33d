#!/usr/bin/env bash
# The layouts an in-flight state could take in Redis, each as its smallest function,
# beside the smallest fixed-window script: Redis instructions per check (callgrind)
# and memory per subject (`used_memory` delta), with one holder and with eight.
# redlimit's own layout (a packed string: 12 bytes for one holder with one slot, else
# an 18-byte header and 17 bytes an entry) is measured by `--bench lua_cost --
# in-flight` against the same reference.
#
#   bash benches/in_flight_layouts.sh                                     # Redis on PATH
#   REDLIMIT_REDIS_SERVER=$(bash .ci/redis8.sh) bash benches/in_flight_layouts.sh  # 7.4+: hash-field TTLs
#
# Needs redis-server, redis-cli, redis-benchmark, valgrind (callgrind_control) and
# python3. Starts its own servers on free loopback ports and stops them.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVER=${REDLIMIT_REDIS_SERVER:-redis-server}
CALLS=${CALLS:-5000}
for tool in "$SERVER" redis-cli redis-benchmark valgrind callgrind_control python3; do
  command -v "$tool" >/dev/null || { echo "in_flight_layouts.sh: $tool is missing" >&2; exit 1; }
done

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.5; rm -rf "$work"' EXIT

# Each function takes one slot for a holder: KEYS[1] the subject's key; ARGV holder,
# limit, slot lifetime (ms). They answer 1 when admitted.
cat >"$work/lib.lua" <<'LUA'
#!lua name=iflayouts
-- The reference: TIME, INCR of a key per window, PEXPIRE when new.
redis.register_function('smallest', function(keys, args)
  local t = redis.call('TIME')
  local w = tonumber(args[1])
  local key = keys[1] .. ':' .. math.floor((t[1] * 1000 + math.floor(t[2] / 1000)) / w)
  local count = redis.call('INCR', key)
  if count == 1 then redis.call('PEXPIRE', key, w) end
  return count
end)
-- redlimit's layout for one holder with one slot, its smallest form: the holder's id
-- and the slot's expiry packed in 12 bytes (more holders take a header and an entry
-- each: `--bench lua_cost -- in-flight` measures the store's own function).
redis.register_function('packed_one', function(keys, args)
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  if redis.call('GET', keys[1]) then return 0 end
  local ttl = tonumber(args[3])
  redis.call('SET', keys[1], struct.pack('>I6I6', tonumber(args[1]), now + ttl), 'PX', ttl)
  return 1
end)
-- A hash of holders with per-field TTLs (Redis 7.4+): a field per holder, its count;
-- the field expires unless renewed. The total is summed over the fields.
redis.register_function('hash_field_ttl', function(keys, args)
  local vals = redis.call('HVALS', keys[1])
  local n = 0
  for i = 1, #vals do n = n + tonumber(vals[i]) end
  if n >= tonumber(args[2]) then return 0 end
  redis.call('HINCRBY', keys[1], args[1], 1)
  redis.call('HPEXPIRE', keys[1], args[3], 'FIELDS', 1, args[1])
  return 1
end)
-- A hash of holders for any server: a field per holder, "count:expiry ms"; entries
-- past their expiry are not counted; the key lives as long as the latest entry.
redis.register_function('hash_entries', function(keys, args)
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local all = redis.call('HGETALL', keys[1])
  local n, mine = 0, 0
  for i = 1, #all, 2 do
    local c, e = string.match(all[i + 1], '^(%d+):(%d+)$')
    c, e = tonumber(c), tonumber(e)
    if e > now then
      n = n + c
      if all[i] == args[1] then mine = c end
    end
  end
  if n >= tonumber(args[2]) then return 0 end
  local ttl = tonumber(args[3])
  redis.call('HSET', keys[1], args[1], (mine + 1) .. ':' .. (now + ttl))
  redis.call('PEXPIRE', keys[1], ttl)
  return 1
end)
LUA

has_field_ttl() { # $1 port: whether the server has HPEXPIRE (Redis 7.4+)
  redis-cli -p "$1" COMMAND INFO HPEXPIRE | grep -qi hpexpire
}

start() { # $1 port, rest: launcher
  local port=$1; shift
  "$@" "$SERVER" --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$port" FUNCTION LOAD REPLACE "$(cat "$work/lib.lua")" >/dev/null
}

# The command of a layout for redis-benchmark, holder $2, over $3 subjects.
command_of() {
  case $1 in
    smallest) echo "FCALL smallest 1 if:{__rand_int__} 60000" ;;
    *) echo "FCALL $1 1 if:{__rand_int__} $2 1000000 300000" ;;
  esac
}

layouts="smallest packed_one hash_entries"
port=$(free_port)
start "$port"
if has_field_ttl "$port"; then layouts="$layouts hash_field_ttl"; fi
echo "server: $("$SERVER" --version | cut -d' ' -f3)"

# Memory: 100,000 subjects, one holder with one slot each.
echo
echo "| layout | used_memory delta / subjects, 1 holder | MEMORY USAGE, 1 holder | the same, 8 holders |"
echo "|---|---|---|---|"
for layout in $layouts; do
  redis-cli -p "$port" FLUSHALL >/dev/null
  before=$(redis-cli -p "$port" INFO memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}')
  # shellcheck disable=SC2046
  redis-benchmark -p "$port" -q -n 1000000 -r 100000 -c 4 -P 16 $(command_of "$layout" 1) >/dev/null
  after=$(redis-cli -p "$port" INFO memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}')
  n=$(redis-cli -p "$port" DBSIZE)
  one=$(redis-cli -p "$port" RANDOMKEY)
  usage1=$(redis-cli -p "$port" MEMORY USAGE "$one")
  for h in 2 3 4 5 6 7 8; do
    if [ "$layout" != smallest ] && [ "$layout" != packed_one ]; then
      redis-cli -p "$port" FCALL "$layout" 1 "$one" "$h" 1000000 300000 >/dev/null
    fi
  done
  usage8=$(redis-cli -p "$port" MEMORY USAGE "$one")
  case $layout in smallest | packed_one) usage8="—" ;; *) usage8="$usage8 B" ;; esac
  python3 -c "print('| $layout | %.1f B (%d subjects) | $usage1 B | $usage8 |' % (($after - $before) / $n, $n))"
done
redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true

# Instructions: the server under callgrind, CALLS calls per row, counted exactly over
# them (zeroed before, dumped after).
cport=$(free_port)
start "$cport" valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p"
count() { # $@: the command; prints instructions per call over CALLS calls
  callgrind_control -z >/dev/null 2>&1
  redis-benchmark -p "$cport" -q -n "$CALLS" -r 100000 -c 4 -P 16 "$@" >/dev/null
  callgrind_control -d >/dev/null 2>&1
  sleep 0.5
  local total
  total=$(grep -h '^summary:' "$work"/cg.* | tail -1 | awk '{print $2}')
  rm -f "$work"/cg.*.[0-9]*
  echo $((total / CALLS))
}
echo
echo "| layout | instructions per check, new subject (1 holder after) | / smallest | instructions per check, 8 holders (7 others' and its own) | / smallest |"
echo "|---|---|---|---|---|"
# shellcheck disable=SC2046
ref=$(count $(command_of smallest))
echo "| smallest fixed-window script, the reference | $ref | 1.00x | | |"
for layout in $layouts; do
  [ "$layout" = smallest ] && continue
  if [ "$layout" = packed_one ]; then
    redis-cli -p "$cport" FLUSHALL >/dev/null
    # shellcheck disable=SC2046
    fresh=$(count $(command_of "$layout" 1))
    python3 -c "print('| $layout | $fresh | %.2fx | — | |' % ($fresh / $ref))"
    continue
  fi
  redis-cli -p "$cport" FLUSHALL >/dev/null
  # shellcheck disable=SC2046
  fresh=$(count $(command_of "$layout" 1))
  # 1,000 subjects, each holding seven other holders' slots, then checks by an eighth.
  redis-cli -p "$cport" FLUSHALL >/dev/null
  for h in 2 3 4 5 6 7 8; do
    # shellcheck disable=SC2046
    redis-benchmark -p "$cport" -q -n 20000 -r 1000 -c 4 -P 16 $(command_of "$layout" "$h") >/dev/null
  done
  # shellcheck disable=SC2046
  eight=$(count -r 1000 $(command_of "$layout" 1))
  python3 -c "print('| $layout | $fresh | %.2fx | $eight | %.2fx |' % ($fresh / $ref, $eight / $ref))"
done
