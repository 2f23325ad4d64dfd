#!/usr/bin/env bash
# Builds local stand-ins for the images docker-compose.yml pulls, for a Docker
# engine without a registry (tests/compose_up.rs, through offline.yml):
#
#   hdsd-standin/bookworm:TAG    Debian bookworm made with debootstrap from the
#                                machine's Debian mirror and `docker import`ed;
#                                stands in for debian:bookworm-slim (the hdsd
#                                image's runtime base) and python:3.12-slim
#                                (the demo apps: python3, `python`)
#   hdsd-standin/rust:TAG        rust:1-bookworm: the host's Rust toolchain and
#                                crates.io cache, cargo offline (only with --rust:
#                                for compiling hdsd in Docker)
#   hdsd-standin/envoy:TAG       envoyproxy/envoy:v1.40.0: the Envoy binary the
#                                other tests run (ENVOY_BIN / scripts/setup.sh)
#   hdsd-standin/prometheus:TAG  prom/prometheus: Debian's prometheus package
#                                as installed on the host
#
# TAG is a hash of every input (this script, standins/, the Debian suite and
# package list, the Envoy and Prometheus binaries, rustc's version and
# Cargo.lock): images that exist with the current TAG are reused, so a run
# builds them at most once and later runs not at all until an input changes.
# Older hdsd-standin images are removed when new ones are built.
#
# Usage: tests/compose/standins.sh [--rust]    (prints TAG on its last line)
# Needs root (debootstrap), debootstrap, docker, rustc/cargo; Envoy via
# ENVOY_BIN or .venv (scripts/setup.sh installs all of them).
# DEBIAN_MIRROR overrides the mirror (default: the first of /etc/apt).
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { echo "standins: $*" >&2; }
die() { say "$*"; exit 1; }

suite=bookworm
packages=ca-certificates,curl,python3,python-is-python3,gcc,libc6-dev
here=tests/compose/standins

envoy=${ENVOY_BIN:-$(ls .venv/lib/python3*/site-packages/envoy/_bin/envoy 2>/dev/null | head -n 1)}
[ -n "$envoy" ] && [ -x "$envoy" ] \
  || die "no Envoy binary: run scripts/setup.sh (it installs Envoy into .venv) or set ENVOY_BIN"
command -v prometheus >/dev/null \
  || die "no Prometheus: install Debian's package (apt-get install prometheus, or scripts/setup.sh)"
command -v rustc >/dev/null && command -v cargo >/dev/null \
  || die "no Rust toolchain (rustc, cargo) on PATH"
docker version >/dev/null 2>&1 || die "no Docker engine answers (docker version failed)"

if [ -z "${DEBIAN_MIRROR:-}" ]; then
  DEBIAN_MIRROR=$(grep -rhoE '(URIs:|^deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
    | grep -oE 'https?://[^ ]+' | head -n 1 || true)
  DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
fi

sysroot=$(rustc --print sysroot)
cargo_home=${CARGO_HOME:-$HOME/.cargo}
prometheus_version=$(dpkg-query -W -f '${Version}' prometheus 2>/dev/null || prometheus --version 2>&1 | head -n 1)

tag=$(
  {
    echo "$suite $packages"
    sha256sum tests/compose/standins.sh "$here"/*
    sha256sum "$envoy" | cut -d' ' -f1
    echo "prometheus $prometheus_version"
  } | sha256sum | cut -c1-16
)
# The rust stand-in also depends on the toolchain and Cargo.lock: a label on
# it, so that a new lock file rebuilds only that image.
rust_inputs=$( { rustc -vV; cargo -V; sha256sum Cargo.lock; } | sha256sum | cut -c1-16)
have() {
  local labels
  labels=$(docker image inspect -f '{{index .Config.Labels "hdsd.inputs"}}' "hdsd-standin/$1:$tag" 2>/dev/null) || return 1
  [ "$1" != rust ] || [ "$labels" = "$rust_inputs" ]
}
images=(bookworm envoy prometheus)
with_rust=false
case "${1:-}" in
  --rust) with_rust=true; images+=(rust) ;;
  "") ;;
  *) die "unknown argument $1 (usage: $0 [--rust])" ;;
esac

have_all() {
  local name
  for name in "${images[@]}"; do
    have "$name" || return 1
  done
}

# One builder at a time per machine; whoever waits finds the images built.
lock=${TMPDIR:-/tmp}/hdsd-standins.lock
exec 9>"$lock"
flock 9
if have_all; then
  say "reusing the hdsd-standin images (${images[*]}) tagged $tag"
  echo "$tag"
  exit 0
fi

start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/hdsd-standins.XXXXXX")
trap 'rm -rf "$work"' EXIT

base=hdsd-standin/bookworm:$tag
if ! have bookworm; then
[ "$(id -u)" -eq 0 ] || die "building the stand-ins needs root (debootstrap): run as root or with sudo"
command -v debootstrap >/dev/null \
  || die "no debootstrap: apt-get install debootstrap (scripts/setup.sh installs it)"
say "debootstrap $suite ($packages) from $DEBIAN_MIRROR"
debootstrap --variant=minbase --include="$packages" "$suite" "$work/rootfs" "$DEBIAN_MIRROR" \
  >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
tar -C "$work/rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' \
  - "hdsd-standin/bookworm:$tag" >/dev/null
rm -rf "$work/rootfs"
fi

build() { # NAME CONTEXT [LABEL]
  docker build --quiet --build-arg "BASE=$base" --label "hdsd.inputs=${3:-}" -f "$here/$1.Dockerfile" -t "hdsd-standin/$1:$tag" "$2" >/dev/null \
    || die "building hdsd-standin/$1 failed (docker build -f $here/$1.Dockerfile)"
}

if ! have envoy; then
say "envoy from $envoy"
mkdir -p "$work/envoy"
cp "$envoy" "$work/envoy/envoy"
cp "$here/envoy-entrypoint.sh" "$work/envoy/"
build envoy "$work/envoy"
fi

if ! have prometheus; then
say "prometheus from Debian's package ($prometheus_version)"
mkdir -p "$work/prometheus/prometheus"
dpkg-query -L prometheus 2>/dev/null \
  | grep -E '^/(usr/bin/prom|usr/share/prometheus/|etc/prometheus/)' \
  | while read -r f; do [ -d "$f" ] || echo "${f#/}"; done \
  | tar -C / -c -T - | tar -C "$work/prometheus/prometheus" -x
[ -x "$work/prometheus/prometheus/usr/bin/prometheus" ] || {
  mkdir -p "$work/prometheus/prometheus/usr/bin"
  cp "$(command -v prometheus)" "$work/prometheus/prometheus/usr/bin/"
}
build prometheus "$work/prometheus"
fi

if $with_rust && ! have rust; then
say "rust from $sysroot and $cargo_home/registry"
# Every crate Cargo.lock names, in the host's cache (downloads what is missing).
cargo fetch --locked --quiet
mkdir -p "$work/rust/toolchain/bin" "$work/rust/toolchain/lib" "$work/rust/cargo-home/registry"
cp "$sysroot/bin/rustc" "$sysroot/bin/cargo" "$work/rust/toolchain/bin/"
cp -a "$sysroot/lib/." "$work/rust/toolchain/lib/"
cp -a "$cargo_home/registry/index" "$cargo_home/registry/cache" "$work/rust/cargo-home/registry/"
build rust "$work/rust" "$rust_inputs"
fi

# Older stand-ins (other tags) are unused now.
docker image ls --format '{{.Repository}}:{{.Tag}}' \
  | grep '^hdsd-standin/' | grep -v ":$tag\$" | xargs -r docker image rm >/dev/null 2>&1 || true

say "built hdsd-standin/*:$tag in $(($(date +%s) - start))s"
echo "$tag"
