#!/usr/bin/env bash
# Builds everything with sanitizers and runs the test suite under them.
#   scripts/test_sanitized.sh asan   ASan + UBSan, the whole ctest suite (build-asan)
#   scripts/test_sanitized.sh tsan   TSan, the server, engine and runner tests (build-tsan)
# Extra arguments go to ctest (e.g. -R Gguf). Every finding fails its test:
# UBSan aborts (-fno-sanitize-recover), ASan/LSan/TSan exit non-zero.
# Suppressions for libraries we link but do not build (libtorch, libgomp)
# are in tests/sanitizers/. DSPARK_TEST_SLOWDOWN stretches the tests' waits
# for decoding (servers, clients) to the sanitized speed.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/test_sanitized.sh asan|tsan [ctest args]}
shift
root=$PWD
case "$kind" in
  asan)
    dir=${SAN_BUILD_DIR:-build-asan}
    flags=address,undefined
    select=()
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
    export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/sanitizers/ubsan.supp"
    export DSPARK_TEST_SLOWDOWN=${DSPARK_TEST_SLOWDOWN:-4}
    ;;
  tsan)
    dir=${SAN_BUILD_DIR:-build-tsan}
    flags=thread
    select=(-R '^(ServeEngine|ServeApi|ServeOpenAI|StopMatcher|ChunkedPrefill|PeerSocket)$')
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp"
    export DSPARK_TEST_SLOWDOWN=${DSPARK_TEST_SLOWDOWN:-15}
    export OMP_NUM_THREADS=1  # see tests/sanitizers/tsan.supp
    ;;
  *) echo "test_sanitized: expected asan or tsan, got '$kind'" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSPARK_SANITIZE="$flags" >/dev/null
cmake --build "$dir" -j "${JOBS:-$(nproc)}"
cd "$dir"
# Sanitized code runs 2-10x slower: one test at a time, generous limits.
ctest --output-on-failure -j 1 --timeout 5400 "${select[@]}" "$@"
