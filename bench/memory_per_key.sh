#!/usr/bin/env bash
# Memory and disk per key: the running agent against Redis holding the same keys, in the same
# run (issue 13). Each server gets RLS calls (the agent) or the GCRA script (Redis) spread over
# KEYS distinct keys until it holds every one of them; then the agent's resident memory and data
# directory, and Redis's resident memory and `used_memory`, each less what the idle process
# used, divided by the keys. The agent's figures are read again after its next checkpoint
# (CHECKPOINT_WAIT). A benchmark: it asserts nothing. See docs/benchmarks.md, "Memory per key".
#
# AGENT_ARGS: more flags for the agent (e.g. "--durability sync").
#
# Build first (release), from the workspace root:
#   CARGO_INCREMENTAL=0 cargo build --release -p allot -p allot-bench
# Then:
#   bench/memory_per_key.sh                 # KEYS=100000
#   KEYS=1000000 bench/memory_per_key.sh
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${CARGO_TARGET_DIR:-target}
ALLOT_BIN=${ALLOT_BIN:-$TARGET/release/allot}
BENCH_BIN=${BENCH_BIN:-$TARGET/release/allot-bench}
KEYS=${KEYS:-100000}
CALLERS=${CALLERS:-16}
# Each load run, long enough to reach every key at 10,000 calls a second (each run walks the
# keys from the first again); runs repeat until the server holds every key.
RUN_SECS=${RUN_SECS:-$(( KEYS / 10000 > 5 ? KEYS / 10000 : 5 ))}
CHECKPOINT_WAIT=${CHECKPOINT_WAIT:-35}
# Longest wait for a process to answer, in tenths of a second.
READY_TENTHS=300

for bin in "$ALLOT_BIN" "$BENCH_BIN" redis-server redis-cli; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "$bin" ] || {
    echo "missing $bin (build or install it first, see the header)" >&2
    exit 1
  }
done

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
# One field of /proc/PID/smaps_rollup, in KiB (Anonymous: heap and anonymous maps).
rollup_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/smaps_rollup"; }
# Resident KiB of the mappings whose path contains $2 (the agent's mapped log segments).
mapped_kib() {
  awk -v p="$2" '/^[0-9a-f]+-[0-9a-f]+ / {m = index($0, p) > 0} m && /^Rss:/ {n += $2}
    END {print n + 0}' "/proc/$1/smaps"
}
per_key() { python3 -c "print(f'{($2 - $1) * $3 / $KEYS:.0f}')"; }

# Runs the load generator against ADDR with WORKLOAD (and any further arguments) until `held`
# (a command printing how many keys the server holds) reaches KEYS.
load_until_held() {
  local addr=$1 workload=$2 held=$3 runs=0
  shift 3
  while [ "$($held)" -lt "$KEYS" ]; do
    "$BENCH_BIN" load --addr "$addr" --workload "$workload" --callers "$CALLERS" \
      --keys "$KEYS" --warmup 0s --duration "${RUN_SECS}s" "$@" >/dev/null
    runs=$((runs + 1))
    [ "$runs" -lt 100 ] || { echo "$workload: the server never held $KEYS keys" >&2; exit 1; }
  done
}

# --- the agent
cat >"$work/limits.yaml" <<'EOF'
# A quota no run reaches: every call is admitted, every key counted.
domain: bench
descriptors:
  - key: key
    rate_limit: {unit: day, requests_per_unit: 4000000000}
EOF
grpc=127.0.0.1:$(free_port)
http=127.0.0.1:$(free_port)
"$ALLOT_BIN" agent --config "$work/limits.yaml" --grpc "$grpc" --http "$http" \
  --data "$work/agent" ${AGENT_ARGS:-} >"$work/agent.log" 2>&1 &
agent=$!
pids+=("$agent")
for _ in $(seq "$READY_TENTHS"); do
  curl -sf "http://$http/v1/status" >/dev/null && break
  sleep 0.1
done
agent_keys() {
  curl -s "http://$http/metrics" | awk '/^allot_keys\{/ {n += $2} END {print n + 0}'
}
agent_idle_kib=$(rss_kib "$agent")
agent_idle_anon=$(rollup_kib "$agent" Anonymous)
agent_idle_disk=$(du -sk "$work/agent" | cut -f1)
load_until_held "$grpc" rls agent_keys
agent_kib=$(rss_kib "$agent")
agent_disk=$(du -sk "$work/agent" | cut -f1)
sleep "$CHECKPOINT_WAIT"
agent_later_kib=$(rss_kib "$agent")
agent_later_anon=$(rollup_kib "$agent" Anonymous)
agent_later_log=$(mapped_kib "$agent" "$work/agent/wal/")
agent_later_disk=$(du -sk "$work/agent" | cut -f1)
held=$(agent_keys)
kill "$agent"
wait "$agent" 2>/dev/null || true

# --- Redis, the same keys through the GCRA script
port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
redis=$!
pids+=("$redis")
for _ in $(seq "$READY_TENTHS"); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis_used() { redis-cli -p "$port" info memory | awk -F: '/^used_memory:/ {print $2}' | tr -d '\r'; }
redis_keys() { redis-cli -p "$port" dbsize | tr -d '\r'; }
redis_idle_kib=$(rss_kib "$redis")
redis_idle_used=$(redis_used)
# One unit an hour and a burst no run reaches: nothing is denied, and each key's TTL (until its
# bucket is full again) is an hour per call, so the keys stay, as the agent's day counters do.
load_until_held "127.0.0.1:$port" redis redis_keys --gcra-interval-us 3600000000 \
  --gcra-burst 1000000000
redis_kib=$(rss_kib "$redis")
redis_used_bytes=$(redis_used)

echo "keys: agent held $held, Redis $(redis_keys) (target $KEYS); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| process | resident, idle -> loaded (MiB) | resident bytes per key | disk bytes per key |"
echo "|---|---|---|---|"
mib() { python3 -c "print(f'{$1 / 1024:.1f}')"; }
echo "| agent | $(mib "$agent_idle_kib") -> $(mib "$agent_kib") | $(per_key "$agent_idle_kib" "$agent_kib" 1024) | $(per_key "$agent_idle_disk" "$agent_disk" 1024) |"
echo "| agent, ${CHECKPOINT_WAIT} s later | $(mib "$agent_idle_kib") -> $(mib "$agent_later_kib") | $(per_key "$agent_idle_kib" "$agent_later_kib" 1024) | $(per_key "$agent_idle_disk" "$agent_later_disk" 1024) |"
echo "| redis-server | $(mib "$redis_idle_kib") -> $(mib "$redis_kib") | $(per_key "$redis_idle_kib" "$redis_kib" 1024) | - (no persistence) |"
echo "| redis used_memory | | $(per_key "$redis_idle_used" "$redis_used_bytes" 1) | |"
ratio=$(python3 -c "print(f'{($agent_later_kib - $agent_idle_kib) / max(1, $redis_kib - $redis_idle_kib):.2f}')")
echo "agent after the wait, per key: anonymous (heap: the budget machine, sled's cache and tree, the log's index) $(per_key "$agent_idle_anon" "$agent_later_anon" 1024), the mapped log $(per_key 0 "$agent_later_log" 1024), other file-backed $(per_key "$((agent_idle_kib - agent_idle_anon))" "$((agent_later_kib - agent_later_anon - agent_later_log))" 1024)"
echo "agent resident per key / Redis resident per key (after the checkpoint wait): ${ratio}x"
