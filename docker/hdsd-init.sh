#!/bin/sh
# Prepares everything the Envoys need to connect to an hdsd with token auth:
# a signing key (only if none works yet), one dataplane token per dataplane,
# and one Envoy bootstrap per dataplane made by `hdsd bootstrap --token-file`.
#
# The single recipe for bootstraps: docker-compose.yml runs it as the
# `hdsd-init` service and scripts/demo.py runs it on this machine, so that the
# demo's and compose's bootstraps come from the same commands and flags
# (tests/compose.rs checks both). Idempotent: run it again and it keeps the
# key, issues fresh tokens and rewrites the bootstraps.
#
# Usage:
#   hdsd-init.sh --server HOST:PORT --out DIR [--config FILE] [--hdsd BIN]
#                [--valid-for DURATION] MESH.NAME:ADMIN_PORT...
#
#   --server     hdsd's HDS address as the Envoys reach it (hdsd:5678 in compose)
#   --out        where to write DIR/MESH.NAME.yaml and DIR/tokens/MESH.NAME.jwt
#   --config     hdsd's config file (its state_dir holds the keys)
#   --hdsd       the hdsd binary (default: hdsd on PATH)
#   --valid-for  token validity (default 720h)
#   MESH.NAME:ADMIN_PORT  a dataplane identity and its Envoy's admin port
#
# POSIX sh only: it runs in the hdsd image (debian:bookworm-slim) too.
set -eu

hdsd=hdsd
config=
server=
out=
valid_for=720h

usage() {
  sed -n '12,21p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --server) [ $# -ge 2 ] || usage; server=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --config) [ $# -ge 2 ] || usage; config=$2; shift 2 ;;
    --hdsd) [ $# -ge 2 ] || usage; hdsd=$2; shift 2 ;;
    --valid-for) [ $# -ge 2 ] || usage; valid_for=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    -*) echo "hdsd-init: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
if [ -z "$server" ] || [ -z "$out" ] || [ $# -eq 0 ]; then
  echo "hdsd-init: --server, --out and at least one MESH.NAME:ADMIN_PORT are required" >&2
  usage
fi

# hdsd with --config when one was given.
run_hdsd() {
  if [ -n "$config" ]; then
    "$hdsd" "$@" --config "$config"
  else
    "$hdsd" "$@"
  fi
}

# Split and check every argument before doing anything.
for dp in "$@"; do
  case "$dp" in
    *.*:*) ;;
    *) echo "hdsd-init: $dp is not MESH.NAME:ADMIN_PORT (e.g. default.web-01:9901)" >&2; exit 2 ;;
  esac
done

mkdir -p "$out/tokens"
chmod 700 "$out/tokens"

# The signing key: keep one that can issue tokens, generate one otherwise.
first=${1%:*}
if run_hdsd token issue --mesh "${first%%.*}" --name "${first#*.}" --valid-for 1m \
    >/dev/null 2>"$out/.issue-check.err"; then
  echo "hdsd-init: a signing key exists; keeping it"
else
  echo "hdsd-init: no signing key can issue tokens yet ($(head -n 1 "$out/.issue-check.err")); generating one"
  run_hdsd token keygen
fi
rm -f "$out/.issue-check.err"

for dp in "$@"; do
  id=${dp%:*}
  admin_port=${dp##*:}
  mesh=${id%%.*}
  name=${id#*.}
  token="$out/tokens/$id.jwt"
  bootstrap="$out/$id.yaml"
  # Write to a temporary file then rename: a reader never sees half a file.
  (umask 077 && run_hdsd token issue --mesh "$mesh" --name "$name" --valid-for "$valid_for" >"$token.tmp")
  mv "$token.tmp" "$token"
  "$hdsd" bootstrap --mesh "$mesh" --name "$name" --server "$server" \
    --token-file "$token" --admin-port "$admin_port" --out "$bootstrap.tmp"
  chmod 644 "$bootstrap.tmp"
  mv "$bootstrap.tmp" "$bootstrap"
  echo "hdsd-init: $id: token $token, bootstrap $bootstrap (hds $server, admin 127.0.0.1:$admin_port)"
done
