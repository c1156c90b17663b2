#!/usr/bin/env bash
# dspark on aarch64 (NEON) from an x86-64 Debian host (make test-arm): the
# cross compiler, qemu-user and an arm64 sysroot (scripts/setup_arm.sh), a
# cross build of the test binary in BUILD_DIR (cmake/aarch64-linux-gnu.cmake),
# then the kernel, model-family and greedy-lossless suites under
# `qemu-aarch64 -cpu max` (NEON with the dot-product and int8 matrix-multiply
# extensions), once on the NEON level and once on the portable one.
#
#   scripts/test_arm.sh [BUILD_DIR]        (default build-arm)
#
# ARM_TEST_FILTER: the GoogleTest filter (default: DSPARK_LEVEL_SUITES of
# CMakeLists.txt, the suites that make test re-runs on each kernel level).
# ARM_LEVELS: the kernel levels to run it on (default "neon portable").
# JOBS: parallel compile jobs (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-arm}
levels=${ARM_LEVELS:-neon portable}
suites=$(sed -n 's/^set(DSPARK_LEVEL_SUITES "\(.*\)")$/\1/p' CMakeLists.txt)
[ -n "$suites" ] || { echo "test_arm: expected set(DSPARK_LEVEL_SUITES \"...\") in CMakeLists.txt, found none" >&2; exit 1; }
# Left out: the ATen reference forward, whose oneDNN convolution/matmul
# primitives Debian's arm64 libtorch cannot create under qemu ("could not
# create a primitive descriptor iterator"); it checks ATen, not the kernels.
filter=${ARM_TEST_FILTER:-"$suites-*AtenForwardMatchesTheKernels*"}

sysroot=$(scripts/setup_arm.sh)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" -DDSPARK_ARM64_SYSROOT="$sysroot" >/dev/null
nice -n 10 cmake --build "$build" -j "${JOBS:-2}" --target dspark_tests

emulate=(qemu-aarch64 -cpu max -L "$sysroot")
# The emulated CPU must run the NEON level, or the NEON run would quietly be
# a second portable one.
version=$("${emulate[@]}" "$build/dspark" --version)
grep -q "kernels neon" <<<"$version" || {
  echo "test_arm: expected the emulated CPU to run the neon kernels; dspark --version says: $version" >&2
  exit 1
}

failed=""
for level in $levels; do
  echo "test_arm: --gtest_filter=$filter on the $level level"
  start=$SECONDS
  # GOMP_SPINCOUNT as CTest sets it for the native tests (CMakeLists.txt).
  if DSPARK_KERNELS=$level GOMP_SPINCOUNT=1000 "${emulate[@]}" "$build/dspark_tests" \
    --gtest_filter="$filter" --gtest_brief=1; then
    echo "test_arm: $level passed in $((SECONDS - start)) s"
  else
    echo "test_arm: $level FAILED after $((SECONDS - start)) s" >&2
    failed="$failed $level"
  fi
done
[ -z "$failed" ] || { echo "test_arm: failed on:$failed" >&2; exit 1; }
