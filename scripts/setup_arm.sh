#!/usr/bin/env bash
# What `make test-arm` needs to build dspark for aarch64 on an x86-64 Debian
# host and run its tests under qemu-user:
#   - the cross compiler and qemu-user (host packages, ARM_HOST_PACKAGES);
#   - an arm64 sysroot: the arm64 builds of every library dspark links
#     (ARM64_SYSROOT_PACKAGES and their dependencies, resolved by apt), whose
#     .debs are unpacked with dpkg -x, never installed: the host's dpkg
#     database and its apt configuration are left as they are (apt runs on a
#     private configuration and state under the cache folder).
#
#   scripts/setup_arm.sh            prints the sysroot's path on stdout
#
# Idempotent: once the sysroot holds the pinned package set, a second run
# downloads nothing. DSPARK_ARM64_SYSROOT overrides where the sysroot goes
# (default $DSPARK_HOME/arm64-sysroot, DSPARK_HOME defaulting to
# ~/.cache/dspark); the downloaded .debs and apt's lists stay beside it
# (arm64-apt/).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=apt_ensure.sh
source "$here/apt_ensure.sh"

home="${DSPARK_HOME:-$HOME/.cache/dspark}"
sysroot="${DSPARK_ARM64_SYSROOT:-$home/arm64-sysroot}"
aptdir="$(dirname "$sysroot")/arm64-apt"
triplet=aarch64-linux-gnu

apt_ensure "$ARM_HOST_PACKAGES" >&2

# The apt requests: name=prefix* (a bare name takes its prefix from DEBIAN_PACKAGES).
requests=()
for spec in $ARM64_SYSROOT_PACKAGES; do
  if [[ "$spec" != *=* ]]; then
    pinned="$(tr ' ' '\n' <<<"$DEBIAN_PACKAGES" | grep -m1 "^$spec=" || true)"
    [ -n "$pinned" ] || { echo "setup_arm: $spec has no version in ARM64_SYSROOT_PACKAGES nor DEBIAN_PACKAGES" >&2; exit 1; }
    spec="$pinned"
  fi
  requests+=("$spec*")
done
stamp="$ARM64_DEBIAN_SUITE ${requests[*]}"
if [ -f "$sysroot/.dspark-request" ] && [ "$(cat "$sysroot/.dspark-request")" = "$stamp" ]; then
  echo "$sysroot"
  exit 0
fi

# apt on its own configuration: arm64 only, an empty dpkg status (so the
# download holds the whole dependency closure), lists and archives under $aptdir.
mkdir -p "$aptdir"/{etc/apt.conf.d,etc/preferences.d,etc/sources.list.d,state/lists/partial,cache/archives/partial}
: >"$aptdir/state/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$aptdir/etc/sources.list" <<EOF
deb [arch=arm64 signed-by=$keyring] $ARM64_DEBIAN_MIRROR $ARM64_DEBIAN_SUITE main
deb [arch=arm64 signed-by=$keyring] $ARM64_DEBIAN_MIRROR $ARM64_DEBIAN_SUITE-updates main
deb [arch=arm64 signed-by=$keyring] $ARM64_DEBIAN_SECURITY_MIRROR $ARM64_DEBIAN_SUITE-security main
EOF
cat >"$aptdir/apt.conf" <<EOF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
APT::Install-Recommends "false";
APT::Install-Suggests "false";
APT::Sandbox::User "root";
Debug::NoLocking "true";
Dir::Etc::SourceList "$aptdir/etc/sources.list";
Dir::Etc::SourceParts "$aptdir/etc/sources.list.d";
Dir::Etc::Parts "$aptdir/etc/apt.conf.d";
Dir::Etc::Preferences "$aptdir/etc/preferences";
Dir::Etc::PreferencesParts "$aptdir/etc/preferences.d";
Dir::State "$aptdir/state";
Dir::State::status "$aptdir/state/status";
Dir::Cache "$aptdir/cache";
EOF
apt_arm64() { APT_CONFIG="$aptdir/apt.conf" apt-get -q "$@"; }
echo "setup_arm: resolving ${requests[*]} for arm64" >&2
apt_arm64 update >&2
# The closure, as apt would install it on an empty arm64 system ("Inst NAME
# (VERSION SUITE [ARCH])..." lines); debs already under $aptdir/cache/archives
# are not downloaded again.
apt_arm64 install --download-only -y "${requests[@]}" >&2
mapfile -t debs < <(apt_arm64 install -s -y "${requests[@]}" |
  sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) [^[]*\[\([^]]*\)\].*/\1_\2_\3.deb/p' | sed 's/:/%3a/' |
  sed "s|^|$aptdir/cache/archives/|")
[ ${#debs[@]} -gt 0 ] || { echo "setup_arm: apt resolved no packages for ${requests[*]}" >&2; exit 1; }

# Unpack into a fresh folder, then swap it in: an interrupted run leaves the
# previous sysroot (or none) in place, never a half-filled one.
tmp="$sysroot.tmp"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "setup_arm: unpacking ${#debs[@]} packages into $sysroot" >&2
for deb in "${debs[@]}"; do
  dpkg-deb -x "$deb" "$tmp"
  dpkg-deb -f "$deb" Package Version | paste -sd' ' >>"$tmp/.dspark-manifest"
done

# Absolute symbolic links point into the host; make them relative, inside the sysroot.
while IFS= read -r -d '' link; do
  target="$(readlink "$link")"
  ln -sfn "$(realpath -ms --relative-to="$(dirname "$link")" "$tmp$target")" "$link"
done < <(find "$tmp" -type l -lname '/*' -print0)

# What maintainer scripts would have done: the BLAS and LAPACK alternatives.
libdir="$tmp/usr/lib/$triplet"
for lib in blas lapack; do
  [ -e "$libdir/lib$lib.so.3" ] || ln -s "$lib/lib$lib.so.3" "$libdir/lib$lib.so.3"
done

# Every shared library's dependencies must be inside the sysroot.
# (readelf skips the linker scripts named lib*.so.)
dirs=("usr/lib/$triplet" "lib/$triplet" usr/lib lib)
missing="$(cd "$tmp" && find "${dirs[@]}" -maxdepth 1 -name 'lib*.so*' -type f -print0 |
  { xargs -0 readelf -d 2>/dev/null || true; } | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u |
  while read -r so; do
    found=""
    for d in "${dirs[@]}"; do [ -e "$d/$so" ] && found=1; done
    [ -n "$found" ] || echo "$so"
  done)"
if [ -n "$missing" ]; then
  echo "setup_arm: libraries needed in the sysroot but not unpacked: $missing" >&2
  exit 1
fi

echo "$stamp" >"$tmp/.dspark-request"
rm -rf "$sysroot"
mv "$tmp" "$sysroot"
echo "setup_arm: arm64 sysroot ready ($(wc -l <"$sysroot/.dspark-manifest") packages, $(du -sh "$sysroot" | cut -f1))" >&2
echo "$sysroot"
