#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS (default 20) from its committed corpus
# (docs/fuzzing.md). Exits non-zero if any target crashes, panics, times out or runs out of
# memory; the input that did it is left in the run's artifacts folder, named in the output.
#
# libFuzzer (the libfuzzer-sys crate, built from its bundled sources by the C++ compiler) on
# the stable toolchain: rustc's own SanitizerCoverage pass gives the coverage, so neither a
# nightly toolchain nor an installed tool is needed (docs/decisions.md, D57).
#
# Usage: fuzz/run.sh [SECONDS] [TARGET...]
#   ALLOT_FUZZ_GROW=1  new inputs are written into the committed corpus (fuzz/corpus/TARGET)
#                      rather than a scratch folder; minimise it afterwards (docs/fuzzing.md).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
seconds="${1:-20}"
shift || true
all_targets=(limits_config wal_replay sync_messages lease_requests rlqs_reports callers_file)
targets=("${all_targets[@]}")
if [ $# -gt 0 ]; then
  targets=("$@")
fi

# Beside the workspace's own build, never in it: these flags would rebuild all of it.
target_dir="${CARGO_TARGET_DIR:-$here/../target}/fuzz"
work="$target_dir/runs"
host="$(rustc -vV | sed -n 's/^host: //p')"

# As cargo-fuzz sets them. With an explicit --target, build scripts and proc macros are
# built without them.
rustflags=(
  --cfg fuzzing
  -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  -Cllvm-args=-sanitizer-coverage-stack-depth
)
echo "== fuzz: building ${targets[*]}"
RUSTFLAGS="${rustflags[*]}" cargo build --release --locked \
  --manifest-path "$here/Cargo.toml" --target "$host" --target-dir "$target_dir" \
  $(printf -- '--bin %s ' "${targets[@]}")

passed=0
failed=0
for t in "${targets[@]}"; do
  corpus="$here/corpus/$t"
  scratch="$work/corpus/$t"
  artifacts="$work/artifacts/$t"
  mkdir -p "$scratch" "$artifacts"
  dirs=("$scratch" "$corpus")
  if [ "${ALLOT_FUZZ_GROW:-0}" = 1 ]; then
    dirs=("$corpus")
  fi
  options=(
    -max_total_time="$seconds"
    -timeout=10
    -rss_limit_mb=2048
    -max_len=8192
    -print_final_stats=1
    -artifact_prefix="$artifacts/"
  )
  if [ -f "$here/dict/$t.dict" ]; then
    options+=(-dict="$here/dict/$t.dict")
  fi
  log="$work/$t.log"
  echo "== fuzz: $t for ${seconds}s"
  if "$target_dir/$host/release/$t" "${options[@]}" "${dirs[@]}" >"$log" 2>&1; then
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
    cov="$(grep -o 'cov: [0-9]*' "$log" | tail -1)"
    echo "   ok: ${runs:-?} runs, ${rate:-?}/s, ${cov:-cov: ?}"
    passed=$((passed + 1))
  else
    echo "   FAILED: the input is in $artifacts; the end of $log:" >&2
    tail -n 40 "$log" >&2
    failed=$((failed + 1))
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
