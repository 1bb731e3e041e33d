#!/usr/bin/env bash
# The gateway example (examples/gateway.rs) as a user meets it: two instances on one
# Redis, the reserve-then-settle budget and the in-flight bound, then one instance
# killed with SIGKILL while it holds three slots. Needs redis-server, redis-cli, curl
# and python3. Starts its own redis-server on a free loopback port; about 20 s.
#
#   bash benches/gateway.sh
#
# Settings (environment): TTL_MS (the instances' IN_FLIGHT_TTL_MS, 6000).
set -euo pipefail
cd "$(dirname "$0")/.."

TTL_MS=${TTL_MS:-6000}
for tool in redis-server redis-cli curl python3; do
  command -v "$tool" >/dev/null || { echo "gateway.sh: $tool is missing" >&2; exit 1; }
done
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
now() { python3 -c 'import time; print(time.monotonic())'; }

cargo build --example gateway >/dev/null 2>&1 || cargo build --example gateway
GATEWAY=target/debug/examples/gateway

REDIS_PORT=$(free_port)
WORK=$(mktemp -d)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize yes --logfile "$WORK/redis.log" --pidfile "$WORK/redis.pid"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

start() { # port
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT/" REDLIMIT_SECRET=bench TOKENS=1000 IN_FLIGHT=3 \
    IN_FLIGHT_TTL_MS="$TTL_MS" PORT="$1" "$GATEWAY" >"$WORK/gateway-$1.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$1/v1/usage" && return
    sleep 0.1
  done
  echo "gateway.sh: the gateway on port $1 did not start" >&2
  exit 1
}
PORT_A=$(free_port); PORT_B=$(free_port)
start "$PORT_A"; A_PID=${PIDS[-1]}
start "$PORT_B"
A=http://127.0.0.1:$PORT_A; B=http://127.0.0.1:$PORT_B
complete() { # url key max use delay
  curl -s -o /dev/null -w '%{http_code}\n' -X POST "$1/v1/complete" -H "x-api-key: $2" \
    -H "x-max-tokens: $3" -H "x-use-tokens: $4" -H "x-delay-ms: $5"
}
usage() { curl -s "$1/v1/usage" -H "x-api-key: $2"; }

echo "## reserve 800, use 100 (on A), read on B"
complete "$A" k1 800 100 0 >/dev/null; usage "$B" k1
echo "## reserve 100, use 500 (on B), read on A"
complete "$B" k2 100 500 0 >/dev/null; usage "$A" k2

echo "## four slow requests of one key, split over A and B (IN_FLIGHT=3)"
CURLS=()
for i in 1 2 3 4; do
  url=$A; [ $((i % 2)) = 0 ] && url=$B
  complete "$url" k3 10 10 1500 >"$WORK/code-$i" &
  CURLS+=($!)
done
sleep 0.5; usage "$A" k3
wait "${CURLS[@]}"
sort "$WORK"/code-* | uniq -c | sed 's/^/  /'
usage "$B" k3

echo "## A holds three slots for 60 s, renewed every $((TTL_MS / 3)) ms; then SIGKILL"
for _ in 1 2 3; do complete "$A" k4 10 10 60000 >/dev/null & done
sleep $(python3 -c "print($TTL_MS / 1000 + 1)")
echo "  one slot lifetime and more later, B sees: $(usage "$B" k4)"
kill -9 "$A_PID"; killed=$(now)
{ wait "$A_PID"; } 2>/dev/null || true
refused=0
while [ "$(complete "$B" k4 1 1 0)" != 200 ]; do refused=$((refused + 1)); sleep 0.05; done
echo "  B refused k4 for $(python3 -c "print(round($(now) - $killed, 2))") s after the kill ($refused refusals), then admitted (bound: $TTL_MS ms)"
