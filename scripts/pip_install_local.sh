#!/usr/bin/env bash
# Installs the dspark Python package from this checkout, building the
# extension module in the CMake build tree $1 (default: build), which `make`
# shares: the C++ core already built there is reused. The build backend and
# pybind11 come from `make setup` (no isolated build environment).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="${1:-build}"
cd "$root"
args=(install --quiet --no-deps --no-build-isolation -C "build-dir=$build_dir" .)
# Debian's python refuses system-wide pip installs unless told otherwise.
if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")) and sys.prefix == sys.base_prefix else 1)'; then
  args+=(--break-system-packages)
fi
# Nothing to do when the installed package is newer than everything it is
# built from (the core library, the bindings, the package's Python files).
stamp="$build_dir/.python-installed"
if [ -f "$stamp" ] && python3 -c 'import dspark' 2>/dev/null &&
   [ -z "$(find python pyproject.toml "$build_dir/libdspark_core.a" -newer "$stamp" -print -quit 2>/dev/null)" ]; then
  echo "dspark Python package: up to date"
  exit 0
fi
echo "dspark Python package: building the extension module and installing it (a few minutes the first time)"
python3 -m pip "${args[@]}"
touch "$stamp"
