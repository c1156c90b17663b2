# shellcheck shell=bash
# apt_ensure "name=version-prefix ..." (sourced by the setup scripts): installs
# the host packages not yet installed, and says which installed ones differ
# from the version dspark is tested with.
apt_ensure() {
  local spec name want have missing=()
  for spec in $1; do
    name="${spec%%=*}"; want="${spec#*=}"
    have="$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null || true)"
    case "$have" in
      "install ok installed $want"*) ;;
      "install ok installed "*)
        echo "setup: $name ${have##* } is installed; dspark is tested with $want*" >&2 ;;
      *) missing+=("$name") ;;
    esac
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}" >&2
    local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}
