#!/usr/bin/env bash
# The CUDA build of dspark, for `dspark train --device cuda` (docs/training.md):
# PyTorch's libtorch from its pinned pip wheel, which carries the CUDA
# runtime (the machine needs an NVIDIA driver, no CUDA toolkit), in a virtual
# environment; then a build tree linked against it; then the checks that
# compare training on the GPU with training on the CPU.
#
#   scripts/setup_cuda.sh [BUILD_DIR]       (default build-cuda; `make cuda`)
#
# DSPARK_TORCH_VENV overrides where the wheel goes (default
# $DSPARK_HOME/torch-cuda, DSPARK_HOME defaulting to ~/.cache/dspark).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=versions.env
source scripts/versions.env
BUILD=${1:-build-cuda}
VENV=${DSPARK_TORCH_VENV:-${DSPARK_HOME:-$HOME/.cache/dspark}/torch-cuda}

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_cuda: creating $VENV"
  python3 -m venv "$VENV" || { echo "setup_cuda: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
fi
echo "setup_cuda: $TORCH_CUDA_PIP into $VENV (about 3 GB with its CUDA libraries)"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "$TORCH_CUDA_PIP"
TORCH_DIR=$("$VENV/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))') ||
  { echo "setup_cuda: torch does not import in $VENV (above); remove $VENV and run again" >&2; exit 1; }
[ -f "$TORCH_DIR/lib/libtorch_cuda.so" ] ||
  { echo "setup_cuda: $TORCH_DIR/lib has no libtorch_cuda.so (a CPU-only wheel?)" >&2; exit 1; }

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSPARK_LIBTORCH="$TORCH_DIR"
cmake --build "$BUILD" -j "$(nproc)" --target dspark dspark_tests

# GPU checks: the ATen forward against the kernels, and training on
# `--device cuda` against the same computation on the CPU (that part is
# skipped, and said so, when no GPU is visible).
"$BUILD/dspark_tests" --gtest_brief=1 \
  --gtest_filter='Families/FamilySuite.AtenForwardMatchesTheKernels/*:TrainTrainer.AtenOnlyTrainsLikeTheKernels:TrainLoss.AtenOpsLossEqualsTheFusedKernel:TrainLevers.MuonUpdatesHiddenMatricesOrthogonallyAndResumes'
if "$VENV/bin/python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "setup_cuda: $BUILD/dspark is ready; train with --device cuda"
else
  echo "setup_cuda: $BUILD/dspark is built, but no CUDA device is visible here; --device cuda will say so"
fi
