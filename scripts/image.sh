#!/usr/bin/env bash
# Builds ferry's container image, localhost/ferry:VERSION (the workspace's version), with
# podman, from Debian packages only: no image registry is needed.
#
#   bash scripts/image.sh [--binaries DIR] [--tag TAG] [--debug-dir DIR]
#
# 1. a base root file system by mmdebstrap (Debian bookworm's essential packages,
#    iproute2, nftables, iptables), imported as localhost/ferry-base:bookworm, made once
#    and kept (remove it with `podman rmi localhost/ferry-base:bookworm` to remake it);
# 2. `ferry` and `ferry-cni` built with `cargo build --release` (or taken from
#    --binaries DIR), stripped of their debug information, which is kept outside the
#    image in --debug-dir (default target/image) as ferry.debug and ferry-cni.debug,
#    named by a debuglink in each binary, for gdb and for symbolizing a crash;
# 3. deploy/image/Containerfile on that base, tagged localhost/ferry:VERSION.
#
# Needs root (mmdebstrap --mode=root, podman). Podman runs with runc and with
# containers.conf's default_ulimits = [] (RLIMIT_NOFILE cannot be raised on some
# machines): CONTAINERS_CONF points at such a file, written here unless given.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages podman:podman runc:runc mmdebstrap:mmdebstrap objcopy:binutils

binaries=""
tag=""
debug_dir=target/image
while [ $# -gt 0 ]; do
  case "$1" in
    --binaries) binaries="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --debug-dir) debug_dir="$2"; shift 2 ;;
    *) echo "usage: $0 [--binaries DIR] [--tag TAG] [--debug-dir DIR]" >&2; exit 2 ;;
  esac
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
tag=${tag:-localhost/ferry:$version}
base=localhost/ferry-base:bookworm

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "${CONTAINERS_CONF:-}" ]; then
  printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' > "$work/containers.conf"
  export CONTAINERS_CONF="$work/containers.conf"
fi

if ! podman image exists "$base"; then
  echo "== base: mmdebstrap bookworm"
  mmdebstrap --quiet --mode=root --variant=essential \
    --include=iproute2,nftables,iptables,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$work/base.tar" http://deb.debian.org/debian
  podman import --quiet "$work/base.tar" "$base" >/dev/null
fi

if [ -z "$binaries" ]; then
  echo "== cargo build --release"
  cargo build --locked --release -p ferry -p ferry-cni
  binaries=target/release
fi
ctx="$work/context"
mkdir -p "$ctx"
cp deploy/image/Containerfile "$ctx/"
mkdir -p "$debug_dir"
for b in ferry ferry-cni; do
  objcopy --only-keep-debug "$binaries/$b" "$debug_dir/$b.debug"
  objcopy --strip-debug --add-gnu-debuglink="$debug_dir/$b.debug" "$binaries/$b" "$ctx/$b"
done
echo "== podman build $tag"
podman build --quiet --network none --build-arg BASE="$base" --build-arg VERSION="$version" \
  -t "$tag" -f "$ctx/Containerfile" "$ctx" >/dev/null
podman image ls "$tag"
