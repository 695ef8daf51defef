#!/usr/bin/env bash
# The axum example gateway (client/examples/axum_gateway.rs) under HTTP load from wrk, with
# allot's tower layer on (every request admitted: the quota is far above what the run sends)
# and off (`--no-layer`), in the same run, alternating. Prints each run's requests per second,
# the non-2xx count (0 when every request was admitted), and the ratio layer-on / layer-off of
# the means and of the best runs. A benchmark: it asserts nothing. See docs/benchmarks.md, "Gateway client".
#
# Build first (release), from the workspace root:
#   CARGO_INCREMENTAL=0 cargo build --release -p allot -p allot-client \
#     --features allot-client/tower --bin allot --example axum_gateway
# Then:
#   bench/axum_wrk.sh            # ROUNDS=3 THREADS=2 CONNECTIONS=32 DURATION=10s KEYS=1
# KEYS=1000 spreads the requests over 1,000 API keys (a wrk Lua script picks one per request).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${CARGO_TARGET_DIR:-target}
ALLOT_BIN=${ALLOT_BIN:-$TARGET/release/allot}
GATEWAY_BIN=${GATEWAY_BIN:-$TARGET/release/examples/axum_gateway}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-32}
DURATION=${DURATION:-10s}
KEYS=${KEYS:-1}
# Longest wait for a process's ready line, in tenths of a second.
READY_TENTHS=300

for bin in "$ALLOT_BIN" "$GATEWAY_BIN"; do
  [ -x "$bin" ] || { echo "missing $bin (build it first, see the header)" >&2; exit 1; }
done
command -v wrk >/dev/null || { echo "wrk is missing (apt-get install -y wrk)" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/limits.yaml" <<'YAML'
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 1000000000}
YAML

# Starts "$@" with stdout to $work/$name.out and waits for `$field=ADDR` on it; sets $addr.
start() {
  local name=$1 field=$2
  shift 2
  "$@" >"$work/$name.out" 2>"$work/$name.err" &
  pids+=($!)
  for _ in $(seq "$READY_TENTHS"); do
    addr=$(grep -o "$field=[^ ]*" "$work/$name.out" 2>/dev/null | head -1 | cut -d= -f2 || true)
    [ -n "$addr" ] && return 0
    sleep 0.1
  done
  echo "$name did not become ready:" >&2
  cat "$work/$name.err" >&2
  exit 1
}

start agent grpc "$ALLOT_BIN" agent --grpc 127.0.0.1:0 --http 127.0.0.1:0 \
  --data "$work/data" --config "$work/limits.yaml"
agent=$addr
start layer_on http "$GATEWAY_BIN" --agent "http://$agent" --listen 127.0.0.1:0 \
  --quota 1000000000 --window-secs 86400
on=$addr
start layer_off http "$GATEWAY_BIN" --no-layer --listen 127.0.0.1:0
off=$addr

cat >"$work/keys.lua" <<LUA
-- One of $KEYS API keys per request.
request = function()
  return wrk.format(nil, nil, { ["x-api-key"] = "key-" .. math.random($KEYS) })
end
LUA
load() {
  if [ "$KEYS" = 1 ]; then
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -H "x-api-key: key-1" "http://$1/"
  else
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s "$work/keys.lua" "http://$1/"
  fi
}
# Requests/sec and the non-2xx count of one wrk report.
figures() {
  local rps bad
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$1")
  bad=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$1")
  echo "$rps ${bad:-0}"
}

echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION, $KEYS key(s), $ROUNDS rounds; agent $agent"
# A short warm-up of each (connections, the first lease).
wrk -t1 -c4 -d2s -H "x-api-key: key-1" "http://$on/" >/dev/null
wrk -t1 -c4 -d2s -H "x-api-key: key-1" "http://$off/" >/dev/null
sum_on=0
sum_off=0
best_on=0
best_off=0
for round in $(seq "$ROUNDS"); do
  for side in off on; do
    [ "$side" = on ] && target=$on || target=$off
    load "$target" >"$work/wrk.txt"
    read -r rps bad < <(figures "$work/wrk.txt")
    printf 'round %d layer %-3s %10s req/s  non-2xx %s\n' "$round" "$side" "$rps" "$bad"
    if [ "$side" = on ]; then
      sum_on=$(echo "$sum_on + $rps" | bc -l)
      best_on=$(echo "if ($rps > $best_on) $rps else $best_on" | bc -l)
    else
      sum_off=$(echo "$sum_off + $rps" | bc -l)
      best_off=$(echo "if ($rps > $best_off) $rps else $best_off" | bc -l)
    fi
  done
done
printf 'mean layer on %.0f req/s, off %.0f req/s, ratio on/off %.3f\n' \
  "$(echo "$sum_on / $ROUNDS" | bc -l)" "$(echo "$sum_off / $ROUNDS" | bc -l)" \
  "$(echo "$sum_on / $sum_off" | bc -l)"
# On a shared machine the best run of each side is the one other load disturbed least.
printf 'best layer on %.0f req/s, off %.0f req/s, ratio on/off %.3f\n' \
  "$best_on" "$best_off" "$(echo "$best_on / $best_off" | bc -l)"
