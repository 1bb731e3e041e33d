#!/usr/bin/env bash
# Where a batch of checks spends Redis's instructions: a redis-server built with
# symbols under callgrind (the distribution's is stripped), the store's function
# library loaded, then for each policy set 200 calls of the batch function of 28 new
# subjects each (what a batch carries at 64 tasks; PER_CALL=1: lone checks), counted from a zero
# (`callgrind_control --zero`) to a dump. Prints the instructions per decision, all of
# them and those of the Lua VM's own loop (`luaV_execute`, exclusive). WRITTEN=1: the
# same calls run once before, unmeasured, so each check finds its subject's state
# written (a token bucket's alone may have expired). FCALL_ONLY=1: only what runs
# inside FCALL is counted (`--toggle-collect=fcallCommand`), so the server's timers
# (serverCron, a few hundred instructions a decision under valgrind) stay out.
#
#   REDLIMIT_REDIS_SERVER=$(bash .ci/redis8.sh) bash benches/lua_profile.sh
#   ... bash benches/lua_profile.sh 'two keys|sw:1000000:60000;tb:1000000:60;|2'
#
# Each argument is `<name>|<set definition>|<keys a subject>` (lua/decide.lua's
# definition: `=` first for a joint set, one key a subject); without arguments, a
# fixed window, and a sliding window and a token bucket in one key.
# Needs valgrind, callgrind_annotate, redis-cli, python3 and cargo. Starts its own
# server on a free loopback port and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVER=${REDLIMIT_REDIS_SERVER:-redis-server}
CALLS=200
PER_CALL=${PER_CALL:-28}
for tool in "$SERVER" valgrind callgrind_annotate callgrind_control redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "lua_profile.sh: $tool is missing" >&2; exit 1; }
done
if [ $# -eq 0 ]; then
  set -- 'fixed window|fw:1000000:60000;|1' 'sliding window + token bucket, one key|=sw:1000000:60000;tb:1000000:60;|1'
fi

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
cargo run -q --release -p redlimit-bench --example function_library > "$dir/library.lua"

collect=()
if [ "${FCALL_ONLY:-0}" = 1 ]; then
  collect=(--toggle-collect=fcallCommand)
fi
valgrind --tool=callgrind "${collect[@]}" --callgrind-out-file="$dir/cg.out" "$SERVER" --port "$port" \
  --save '' --appendonly no > "$dir/valgrind.log" 2>&1 &
server=$!
for _ in $(seq 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.2
done
batch="$(redis-cli -p "$port" -x FUNCTION LOAD < "$dir/library.lua")_batch"

# `count` calls of the batch function for `set`, subjects named after `tag`, as RESP.
calls() {
  python3 - "$batch" "$1" "$2" "$3" "$4" "$PER_CALL" <<'PY'
import sys
function, definition, per, tag, count, per_call = sys.argv[1:7]
out = sys.stdout.buffer
# The head: Redis TIME, no flags, one set (contract/mod.rs).
head = b"t@\x01" + definition.encode()
subject = 0
for _ in range(int(count)):
    keys = []
    for _ in range(int(per_call)):
        keys += [f"rl:{{{tag}{subject}}}:abcdef012345:k{p}" for p in range(int(per))]
        subject += 1
    args = [b"FCALL", function.encode(), str(len(keys)).encode()] + [k.encode() for k in keys] + [head]
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
PY
}

i=0
for spec in "$@"; do
  name=${spec%%|*}; rest=${spec#*|}; definition=${rest%|*}; per=${rest##*|}
  calls "$definition" "$per" "s$i-" "$CALLS" > "$dir/calls.resp"
  if [ "${WRITTEN:-0}" = 1 ]; then
    redis-cli -p "$port" --pipe < "$dir/calls.resp" >/dev/null
  else
    calls "$definition" "$per" "warm$i-" 20 | redis-cli -p "$port" --pipe >/dev/null
    redis-cli -p "$port" flushall >/dev/null
  fi
  callgrind_control --zero "$server" >/dev/null 2>&1
  redis-cli -p "$port" --pipe < "$dir/calls.resp" | grep -q "errors: 0" \
    || { echo "lua_profile.sh: $name: a call failed" >&2; exit 1; }
  callgrind_control --dump="$i" "$server" >/dev/null 2>&1
  redis-cli -p "$port" flushall >/dev/null
  dump=$(ls -t "$dir"/cg.out.* | head -1)
  total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  vm=$(callgrind_annotate --inclusive=no --threshold=100 "$dump" 2>/dev/null \
    | awk '/luaV_execute/ && !seen { gsub(",", "", $1); print $1; seen = 1 }')
  decisions=$((CALLS * PER_CALL))
  echo "$name: $((total / decisions)) instructions a decision, $((${vm:-0} / decisions)) in luaV_execute"
  i=$((i + 1))
done
