#!/usr/bin/env bash
# Packs what a training run needs to continue on another machine into one
# byte-reproducible .tar.xz:
#
#   scripts/data/pack_run.sh OUT [ARCHIVE]     # ARCHIVE default: $(basename OUT).run.tar.xz
#
# OUT is a `dspark train --out` directory. The archive holds, under
# $(basename OUT)/:
#   checkpoints/latest.json and the step directory it names: the fp32
#     weights, optimizer.pt (AdamW moments or Muon momenta and AdamW's) and
#     trainer_state.json (step, epoch, cursor in the epoch's order, RNG, the
#     run's configuration and the fingerprint and recipe of its data);
#   the bf16 drafter export and metrics.jsonl next to them.
# Not the data: a run resumes only on the data it started on (the trainer
# checks the fingerprint), which travels as data/regen/NAME.tar.xz
# (scripts/data/pack_regen.sh) or is regenerated from its recipe. Not older
# checkpoints, nor the feature cache (rebuilt by --fill-feature-cache).
# Restore with scripts/data/restore_training.sh (RUN=ARCHIVE), which also
# prints the `dspark train --resume` command of the run.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=scripts/data/repro_tar.sh
source "$REPO/scripts/data/repro_tar.sh"
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: pack_run.sh OUT [ARCHIVE]" >&2; exit 2; }
OUT="${1%/}" NAME="$(basename "${1%/}")"
ARCHIVE="${2:-$NAME.run.tar.xz}"
latest="$OUT/checkpoints/latest.json"
[[ -f "$latest" ]] || { echo "$latest: missing (not a dspark train --out directory with a checkpoint)" >&2; exit 1; }
step_dir=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['dir'])" "$latest")
[[ -f "$OUT/checkpoints/$step_dir/trainer_state.json" ]] ||
  { echo "$OUT/checkpoints/$step_dir: no trainer_state.json (an incomplete checkpoint)" >&2; exit 1; }
files=("checkpoints/latest.json")
while IFS= read -r f; do files+=("$f"); done < <(
  cd "$OUT" && { find "checkpoints/$step_dir" -type f; find . -maxdepth 1 -type f ! -name '.*' -printf '%P\n'; } | sort)
XZ_LEVEL="${XZ_LEVEL:--1}" repro_tar_xz "$(dirname "$OUT")" "$ARCHIVE" "${files[@]/#/$NAME/}"
python3 - "$OUT/checkpoints/$step_dir/trainer_state.json" "$ARCHIVE" <<'PY'
import json, os, sys
st = json.load(open(sys.argv[1]))
d = st.get("data", {})
print(f"{sys.argv[2]}: step {st['step']} (epoch {st['epoch']}), {os.path.getsize(sys.argv[2])} bytes; "
      f"data {d.get('n_sequences', '?')} sequences, {d.get('n_tokens', '?')} tokens, hash {d.get('hash', '? (an older checkpoint)')}")
PY
