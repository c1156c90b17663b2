#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang with
# -fsanitize=fuzzer,address,undefined) in $FUZZ_DIR and runs each for
# $FUZZ_SECONDS, $FUZZ_JOBS at a time. New inputs go to
# $FUZZ_DIR/corpus/<target> (the committed seeds in tests/fuzz/corpus/<target>
# are read, never written); crashes to $FUZZ_DIR/artifacts/<target>/. Prints
# each target's executions and coverage (libFuzzer's final line).
#   FUZZ_TARGETS="gguf tokenizer" FUZZ_SECONDS=600 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_JOBS=${FUZZ_JOBS:-2}
FUZZ_TARGETS=${FUZZ_TARGETS:-gguf safetensors drafter_config tokenizer tokenizer_spm chat_template http_request}
CXX=${FUZZ_CXX:-clang++}
command -v "$CXX" >/dev/null || { echo "fuzz: $CXX not found (Debian: apt-get install -y clang)" >&2; exit 2; }

cmake -S . -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$CXX" -DDSPARK_FUZZ=ON >/dev/null
cmake --build "$FUZZ_DIR" --target $(printf 'fuzz_%s ' $FUZZ_TARGETS)

run_one() {
  local t=$1
  mkdir -p "$FUZZ_DIR/corpus/$t" "$FUZZ_DIR/artifacts/$t"
  # One process; -rss_limit_mb bounds a runaway allocation (a finding too).
  if "$FUZZ_DIR/fuzz_$t" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 \
       -artifact_prefix="$FUZZ_DIR/artifacts/$t/" "$FUZZ_DIR/corpus/$t" "tests/fuzz/corpus/$t" \
       >"$FUZZ_DIR/$t.log" 2>&1; then
    echo "$t: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$FUZZ_DIR/$t.log" | tail -1)"
  else
    echo "$t: FAILED (see $FUZZ_DIR/$t.log and $FUZZ_DIR/artifacts/$t/)"
    return 1
  fi
}
export -f run_one
export FUZZ_DIR FUZZ_SECONDS
printf '%s\n' $FUZZ_TARGETS | xargs -P "$FUZZ_JOBS" -I{} bash -c 'run_one {}'
