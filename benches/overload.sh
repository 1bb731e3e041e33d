#!/usr/bin/env bash
# The quickstart on Redis under a flood of connections: how many answers pass
# undecided (no RateLimit headers: fail-open) while Redis is healthy. Needs
# redis-server, wrk and python3. Starts its own redis-server and the quickstart on
# free loopback ports; each wrk run is bounded (DURATION seconds).
#
#   bash benches/overload.sh                      # 1,024 then 2,048 connections, 3 rounds
#   BIN=/path/to/quickstart bash benches/overload.sh   # another build (say, an older commit)
#   CONNECTIONS=256 BUSY=1 bash benches/overload.sh    # beside two busy loops per core
#
# Settings (environment): CONNECTIONS ("1024 2048"), DURATION (8), ROUNDS (3), BUSY (0:
# with 1, two busy loops per core run beside each wrk run, and stop with it).
set -euo pipefail
cd "$(dirname "$0")/.."

CONNECTIONS=${CONNECTIONS:-1024 2048}
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}

for tool in redis-server wrk python3; do
  command -v "$tool" >/dev/null || { echo "overload.sh: $tool is missing" >&2; exit 1; }
done

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

if [ -z "${BIN:-}" ]; then
  cargo build --release --example quickstart >/dev/null 2>&1 || cargo build --release --example quickstart
  BIN=target/release/examples/quickstart
fi

busy=()
# Whatever ends the script, no busy loop outlives it.
trap 'if [ ${#busy[@]} -gt 0 ]; then kill "${busy[@]}" 2>/dev/null || true; fi' EXIT

for round in $(seq "$ROUNDS"); do
  for c in $CONNECTIONS; do
    rport=$(free_port)
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    redis=$!
    aport=$(free_port)
    until [ "$(redis-cli -p "$rport" ping 2>/dev/null)" = PONG ]; do sleep 0.1; done
    REDIS_URL="redis://127.0.0.1:$rport/" REDLIMIT_SECRET=overload-bench-secret PORT=$aport \
      "$BIN" >/dev/null 2>${APP_LOG:-/dev/null} &
    app=$!
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', $aport))" 2>/dev/null; do
      sleep 0.1
    done
    busy=()
    if [ "${BUSY:-0}" = 1 ]; then
      for _ in $(seq $(( $(nproc) * 2 ))); do (while :; do :; done) & busy+=($!); done
    fi
    line=$(timeout $((DURATION + 20)) wrk -t2 -c"$c" -d"${DURATION}s" -s benches/wrk/api_keys.lua \
      "http://127.0.0.1:$aport/" | awk '/Requests\/sec/ { rps = $2 } /^answers/ { a = $0 } END { print rps, a }')
    if [ ${#busy[@]} -gt 0 ]; then kill "${busy[@]}"; fi
    echo "round $round  -c$c  busy ${BUSY:-0}  req/s $line"
    kill "$app" "$redis"
    wait "$app" "$redis" 2>/dev/null || true
  done
done
