# Shared set-up for ferry's scripts: toolchain on PATH and Debian packages installed.
# Sourced, not run.

# cargo lives in ~/.cargo/bin on these machines; a non-login shell may not have it.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "ferry: cargo (Rust 1.95) is needed and was not found on PATH or in ~/.cargo/bin" >&2
  exit 1
fi

# ensure_packages CMD:PACKAGE ...: installs PACKAGE with apt-get when CMD is missing.
# CMD may be an absolute path instead, for a package that brings a file but no command.
ensure_packages() {
  local missing=()
  local pair cmd pkg
  for pair in "$@"; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    case $cmd in
      /*) [ -e "$cmd" ] || missing+=("$pkg") ;;
      *) command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg") ;;
    esac
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "ferry: please install as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "ferry: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
