#!/usr/bin/env bash
# make test-full: the long greedy-lossless sweep (SpecGreedy.*, real SmolLM2)
# on every lower kernel level this CPU runs; make test runs the shorter
# per-level suites (CMakeLists.txt, kernel_level.*).
set -euo pipefail
build="${1:-build}"
# "dspark 0.1.0 (kernels avx2+f16c; this CPU runs: portable avx2)"
levels="$("$build/dspark" --version | sed -n 's/.*this CPU runs: \([a-z0-9 ]*\)).*/\1/p')"
best="${levels##* }"
for level in $levels; do
  [ "$level" = "$best" ] && continue
  echo "== SpecGreedy.* on the $level kernels"
  DSPARK_KERNELS="$level" GOMP_SPINCOUNT=1000 DSPARK_TEST_FULL=1 "$build/dspark_tests" --gtest_filter='SpecGreedy.*'
done
