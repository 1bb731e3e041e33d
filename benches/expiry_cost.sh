#!/usr/bin/env bash
# What a key's expiry costs Redis: 100,000 keys written with a 1 s TTL
# (`SET .. PX 1000` by redis-benchmark, pipelined), then Redis's main-thread CPU over
# the 3 s in which its own timer expires them, less the same 3 s idle, per key
# expired. Every limiter that creates a key per subject pays it once per key,
# whatever it sends: it is the share of Redis CPU that batching cannot take off a
# request that creates its key (the HTTP table's 100,000 API keys, BENCHMARKS.md).
#
#   bash benches/expiry_cost.sh            # 3 rounds, Redis on PATH
#   ROUNDS=5 REDLIMIT_REDIS_SERVER=$(bash .ci/redis8.sh) bash benches/expiry_cost.sh
#
# Needs redis-server, redis-cli, redis-benchmark and python3. Starts its own server
# on a free loopback port for each round and stops it.
set -euo pipefail

SERVER=${REDLIMIT_REDIS_SERVER:-redis-server}
ROUNDS=${ROUNDS:-3}
KEYS=100000
for tool in "$SERVER" redis-cli redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "expiry_cost.sh: $tool is missing" >&2; exit 1; }
done

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT

# Redis's main-thread CPU seconds, user and system.
cpu() {
  redis-cli -p "$port" info cpu | awk -F: '/used_cpu_(sys|user)_main_thread/ { s += $2 } END { printf "%.6f", s }'
}

for round in $(seq "$ROUNDS"); do
  "$SERVER" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile /dev/null
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
  idle_from=$(cpu); sleep 3; idle_to=$(cpu)
  written_from=$(cpu)
  redis-benchmark -p "$port" -n "$KEYS" -r 1000000000 -P 16 -q SET 'k:__rand_int__' 1 PX 1000 >/dev/null
  written_to=$(cpu)
  sleep 3
  expired_to=$(cpu)
  expired=$(redis-cli -p "$port" info stats | awk -F: '/^expired_keys:/ { print $2 + 0 }')
  left=$(redis-cli -p "$port" dbsize)
  redis-cli -p "$port" shutdown nosave >/dev/null
  python3 - "$round" "$KEYS" "$idle_from" "$idle_to" "$written_from" "$written_to" "$expired_to" "$expired" "$left" <<'PY'
import sys
round_, keys = sys.argv[1], int(sys.argv[2])
idle_from, idle_to, written_from, written_to, expired_to = map(float, sys.argv[3:8])
expired, left = int(sys.argv[8]), int(sys.argv[9])
idle = idle_to - idle_from
print(f"round {round_}: writing {(written_to - written_from) * 1e6 / keys:.2f} µs a key; "
      f"expiring {(expired_to - written_to - idle) * 1e6 / max(expired, 1):.2f} µs a key "
      f"({expired} expired, {left} left; the idle 3 s: {idle * 1e6 / keys:.2f} µs a key)")
PY
done
