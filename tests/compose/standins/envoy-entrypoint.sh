#!/bin/sh
# The behaviour of the official Envoy image's entrypoint that compose uses:
# arguments starting with `-` are Envoy's; $loglevel adds --log-level; run as
# root (the default), it drops to the `envoy` user unless ENVOY_UID=0, after
# optionally moving that user to $ENVOY_UID/$ENVOY_GID.
set -e
case "$1" in
  -*) set -- envoy "$@" ;;
esac
if [ "$1" = envoy ] && [ -n "${loglevel:-}" ]; then
  set -- "$@" --log-level "$loglevel"
fi
if [ "$(id -u)" = 0 ] && [ "${ENVOY_UID:-}" != 0 ]; then
  [ -z "${ENVOY_UID:-}" ] || usermod -u "$ENVOY_UID" envoy
  [ -z "${ENVOY_GID:-}" ] || groupmod -g "$ENVOY_GID" envoy
  chown envoy:envoy /dev/stdout /dev/stderr 2>/dev/null || true
  exec setpriv --reuid=envoy --regid=envoy --init-groups "$@"
fi
exec "$@"
