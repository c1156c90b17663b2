#!/usr/bin/env bash
# Packs a `dspark regen` data set into one reproducible .tar.xz for the
# repository (data/regen/NAME.tar.xz), so that a fresh clone gets back the
# target-written token data that took hours of CPU to generate.
#
#   scripts/data/pack_regen.sh DIR [OUT]     # OUT default: data/regen/$(basename DIR).tar.xz
#
# Only what the trainer reads goes in: manifest.json and the shards it lists
# (not the lock file or a log). The archive is byte-reproducible for the same
# data (sorted names, fixed mtime and owner, no xz timestamps), so repacking
# unchanged data changes nothing in git. Unpack with
# scripts/data/restore_training.sh (or `tar -xJf OUT -C DEST`).
set -euo pipefail
DIR="${1:?usage: pack_regen.sh DIR [OUT]}"
DIR="${DIR%/}"
NAME="$(basename "$DIR")"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${2:-$REPO/data/regen/$NAME.tar.xz}"
[[ -f "$DIR/manifest.json" ]] || { echo "$DIR: no manifest.json (not a dspark regen data set)" >&2; exit 1; }
files=(manifest.json)
while IFS= read -r f; do files+=("$f"); done < <(python3 - "$DIR/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for s in m["shards"]:
    print(s["file"] if isinstance(s, dict) else s)
PY
)
for f in "${files[@]}"; do [[ -f "$DIR/$f" ]] || { echo "$DIR/$f: listed in the manifest but missing" >&2; exit 1; }; done
# shellcheck source=scripts/data/repro_tar.sh
source "$REPO/scripts/data/repro_tar.sh"
repro_tar_xz "$(dirname "$DIR")" "$OUT" "${files[@]/#/$NAME/}"
raw=$(cd "$DIR" && du -cb "${files[@]}" | tail -1 | cut -f1)
packed=$(stat -c %s "$OUT")
tokens=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('n_tokens', 0))" "$DIR/manifest.json")
echo "$OUT: ${#files[@]} files, $raw bytes -> $packed bytes ($(awk -v p="$packed" -v t="$tokens" 'BEGIN { printf "%.2f", t ? p / t : 0 }') bytes/token, $tokens tokens); sha256 $(sha256sum "$OUT" | cut -d' ' -f1)"
