#!/usr/bin/env bash
# Sourced by the pack scripts: repro_tar_xz BASE OUT FILE... writes FILE...
# (paths relative to BASE) into OUT as a byte-reproducible .tar.xz (sorted
# names, fixed mtime, owner and modes, no xz timestamps), atomically (a
# scratch file renamed into place), so packing unchanged files again gives
# the same bytes and changes nothing in git. XZ_LEVEL (default -9e) is the
# xz preset: token ids gain from -9e; fp32 weights and optimizer moments
# hardly compress at any level, and -9e takes minutes per 100 MB.
repro_tar_xz() {
  local base="$1" out="$2"
  shift 2
  mkdir -p "$(dirname "$out")"
  local tmp="$out.tmp.$$"
  # shellcheck disable=SC2064
  trap "rm -f '$tmp'" EXIT
  tar --sort=name --mtime='@0' --owner=0 --group=0 --numeric-owner --mode='a+r,u+w,go-w' \
      -C "$base" -cf - "$@" | xz "${XZ_LEVEL:--9e}" -T1 --check=crc64 > "$tmp"
  mv "$tmp" "$out"
  trap - EXIT
}
