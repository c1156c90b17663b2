#!/usr/bin/env bash
# Installs everything dspark needs from Debian and fetches the default model.
# Idempotent: a second run installs nothing and downloads nothing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

# shellcheck source=apt_ensure.sh
source "$here/apt_ensure.sh"
apt_ensure "$DEBIAN_PACKAGES"

# Python packages: pip_ensure MODULE SPEC installs SPEC unless MODULE imports
# at SPEC's version.
pip_ensure() {
  local module="$1" spec="$2" want="${2##*==}"
  local have
  have="$(python3 -c "import importlib.metadata as m; print(m.version('${spec%%==*}'))" 2>/dev/null || true)"
  if [ "$have" = "$want" ] && python3 -c "import $module" >/dev/null 2>&1; then return; fi
  echo "setup: installing $spec (pip)" >&2
  # Debian's python refuses system-wide pip installs unless told otherwise.
  python3 -m pip install --quiet "$spec" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "$spec"
}

# The official OpenAI Python client: the real client of the server tests.
if ! python3 -c 'import openai' >/dev/null 2>&1; then
  pip_ensure openai "$OPENAI_PIP"
fi
# The Python package: build backend and bindings (make python), plots and tests.
pip_ensure scikit_build_core "$SCIKIT_BUILD_CORE_PIP"
pip_ensure pybind11 "$PYBIND11_PIP"
pip_ensure matplotlib "$MATPLOTLIB_PIP"
pip_ensure pytest "$PYTEST_PIP"
# llama.cpp's GGUF library: the build writes the tiny Qwen3 test GGUFs with it
# (scripts/golden/qwen3_tiny.py).
pip_ensure gguf "$GGUF_PIP"

"$here/fetch_model.sh" smollm2
"$here/fetch_model.sh" gemma3
