#!/usr/bin/env bash
# Writes tests/golden/llamacpp_perplexity.json: llama-perplexity's running
# perplexity per chunk on a text none of this code was tuned on (Debian's
# text of the GPL, /usr/share/common-licenses/GPL-3), -c 512, 2 threads.
# Needs a llama.cpp build ($LLAMACPP_DIR, default ~/.cache/llamacpp; see
# ../shared/tools/build-llamacpp.sh) and the SmolLM2 GGUF (make setup).
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
source "$here/scripts/versions.env"
model="${DSPARK_HOME:-$HOME/.cache/dspark}/models/$SMOLLM2_GGUF"
text=/usr/share/common-licenses/GPL-3
bin="${LLAMACPP_DIR:-$HOME/.cache/llamacpp}/build/bin"
out="$("$bin/llama-perplexity" -m "$model" -f "$text" -c 512 -t 2 2>&1)"
build="$(cd "${LLAMACPP_DIR:-$HOME/.cache/llamacpp}" && git log -1 --format=%h 2>/dev/null || echo unknown)"
python3 - "$build" "$text" "$(sha256sum "$text" | cut -d' ' -f1)" "$SMOLLM2_GGUF" <<PY > "$here/tests/golden/llamacpp_perplexity.json"
import json, re, sys
out = """$out"""
running = [float(v) for v in re.findall(r"\[\d+\](\d+\.\d+)", out)]
final = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
print(json.dumps({"llama_cpp_build": sys.argv[1], "text": sys.argv[2], "text_sha256": sys.argv[3],
                  "model": sys.argv[4], "n_ctx": 512, "threads": 2, "running_ppl": running,
                  "final_ppl": float(final.group(1)), "final_error": float(final.group(2))}, indent=2))
PY
echo "wrote tests/golden/llamacpp_perplexity.json" >&2
