#!/usr/bin/env bash
# Leases through the fleet program (benches/programs/fleet.rs) under wrk, every figure beside its same-run
# reference. Needs redis-server, redis-cli, wrk and curl (Debian: redis-server, wrk,
# curl). Starts its own redis-server on a free loopback port; about 4 minutes.
#
#   bash benches/fleet.sh                 # both parts
#   bash benches/fleet.sh overload        # 4 instances, one hot key at many times LIMIT
#   bash benches/fleet.sh throughput      # one instance, the hot key under its limit
#
# Settings (environment): LIMIT (1000), MEASURE (30 s), WARM (5 s), ROUNDS (3),
# CONNECTIONS (8 per instance for the overload, 32 for the throughput turns).
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT=${LIMIT:-1000}
MEASURE=${MEASURE:-30}
WARM=${WARM:-5}
ROUNDS=${ROUNDS:-3}
PART=${1:-all}

for tool in redis-server redis-cli wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "fleet.sh: $tool is missing" >&2; exit 1; }
done

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cargo build --release -p redlimit-bench --example fleet >/dev/null 2>&1 || cargo build --release -p redlimit-bench --example fleet
FLEET=target/release/examples/fleet

REDIS_PORT=$(free_port)
WORK=$(mktemp -d)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize yes --logfile "$WORK/redis.log" --pidfile "$WORK/redis.pid"
FLEET_PID=
cleanup() {
  [ -n "$FLEET_PID" ] && kill "$FLEET_PID" 2>/dev/null || true
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/"

# INFO figures: calls of the Lua commands, and the main thread's CPU seconds.
redis_calls() {
  redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
    awk -F'[=,:]' '/^cmdstat_(fcall|evalsha|eval):/ { n += $3 } END { print n + 0 }'
}
redis_cpu() {
  redis-cli -p "$REDIS_PORT" info cpu | tr -d '\r' |
    awk -F: '/^used_cpu_(sys|user)_main_thread:/ { s += $2 } END { printf "%.6f\n", s }'
}

# Sum of the /stats fields of instances on ports $1 .. $1+$2-1: "admitted denied".
fleet_counts() {
  local a=0 d=0 line
  for p in $(seq "$1" $(($1 + $2 - 1))); do
    line=$(curl -s "http://127.0.0.1:$p/stats")
    a=$((a + $(sed 's/.*admitted=\([0-9]*\).*/\1/' <<<"$line")))
    d=$((d + $(sed 's/.*denied=\([0-9]*\).*/\1/' <<<"$line")))
  done
  echo "$a $d"
}

start_fleet() { # env assignments..., then INSTANCES
  local port
  port=$(free_port)
  # Four consecutive ports: the first free one and its neighbours are checked by bind.
  env "$@" PORT="$port" "$FLEET" >"$WORK/fleet.log" 2>&1 &
  FLEET_PID=$!
  for _ in $(seq 100); do curl -s "http://127.0.0.1:$port/stats" >/dev/null 2>&1 && break; sleep 0.1; done
  FLEET_PORT=$port
}
stop_fleet() {
  kill -INT "$FLEET_PID" 2>/dev/null || true
  wait "$FLEET_PID" 2>/dev/null || true
  FLEET_PID=
}

overload() { # $1: on or off
  start_fleet INSTANCES=4 LIMIT="$LIMIT" LEASES="$1"
  local conns=${CONNECTIONS:-8} total=$((WARM + MEASURE + 2)) loads=()
  for p in $(seq "$FLEET_PORT" $((FLEET_PORT + 3))); do
    wrk -t1 -c"$conns" -d"${total}s" -H 'x-api-key: hot' "http://127.0.0.1:$p/" >"$WORK/wrk-$p.log" 2>&1 &
    loads+=($!)
  done
  sleep "$WARM"
  read -r a0 d0 < <(fleet_counts "$FLEET_PORT" 4)
  local c0 cpu0 t0 t1
  c0=$(redis_calls); cpu0=$(redis_cpu); t0=$(date +%s.%N)
  sleep "$MEASURE"
  read -r a1 d1 < <(fleet_counts "$FLEET_PORT" 4)
  local c1 cpu1
  c1=$(redis_calls); cpu1=$(redis_cpu); t1=$(date +%s.%N)
  wait "${loads[@]}"
  stop_fleet
  python3 - "$1" "$LIMIT" "$a0" "$d0" "$a1" "$d1" "$c0" "$c1" "$cpu0" "$cpu1" "$t0" "$t1" <<'EOF'
import sys
mode, limit = sys.argv[1], int(sys.argv[2])
a0, d0, a1, d1, c0, c1 = map(int, sys.argv[3:9])
cpu0, cpu1, t0, t1 = map(float, sys.argv[9:13])
secs = t1 - t0
admitted, requests, calls = a1 - a0, (a1 - a0) + (d1 - d0), c1 - c0
print(f"| leases {mode} | {requests / secs:,.0f} | {admitted / secs:,.1f} ({admitted / secs / limit:.3f}x LIMIT) "
      f"| {calls / secs:,.0f} | {calls / max(requests, 1):.4f} | {(cpu1 - cpu0) / secs * 100:.1f}% |")
EOF
}

throughput_turn() { # env assignments...; prints requests/s
  start_fleet INSTANCES=1 LIMIT=1000000000 "$@"
  wrk -t1 -c"${CONNECTIONS:-32}" -d1s -H 'x-api-key: hot' "http://127.0.0.1:$FLEET_PORT/" >/dev/null 2>&1
  wrk -t1 -c"${CONNECTIONS:-32}" -d10s -H 'x-api-key: hot' "http://127.0.0.1:$FLEET_PORT/" |
    awk '/^Requests\/sec/ { print $2 }'
  stop_fleet
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$PART" = all ] || [ "$PART" = overload ]; then
  echo
  echo "## One hot key through 4 instances, LIMIT=$LIMIT/s sliding window, 4 x wrk -c${CONNECTIONS:-8}; ${MEASURE} s measured after ${WARM} s"
  echo
  echo "| run | requests/s | admitted/s | Redis calls/s | Redis calls per request | Redis main-thread CPU |"
  echo "|---|---|---|---|---|---|"
  overload on
  overload off
fi
if [ "$PART" = all ] || [ "$PART" = throughput ]; then
  echo
  echo "## One instance, the hot key under its limit (LIMIT=1e9), wrk -c${CONNECTIONS:-32}, 10 s turns in rotation"
  echo
  echo "| round | memory store (requests/s) | Redis store with leases (requests/s) | ratio |"
  echo "|---|---|---|---|"
  for round in $(seq "$ROUNDS"); do
    mem=$(throughput_turn STORE=memory)
    leased=$(throughput_turn LEASES=on)
    python3 -c "import sys; m, l = float(sys.argv[1]), float(sys.argv[2]); print(f'| {sys.argv[3]} | {m:,.0f} | {l:,.0f} | {l / m:.3f}x |')" "$mem" "$leased" "$round"
  done
fi
echo
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
