# hdsd container image.
#   docker build -t hdsd .
#   docker run -v "$PWD/examples/dataplanes:/etc/hdsd/dataplanes:ro" -v hdsd-state:/var/lib/hdsd -p 5678:5678 hdsd
# Ports: 5678 gRPC HDS (Envoys connect here), 5680 REST API + /metrics + /healthz.
# docker-compose.yml runs the whole demo (hdsd, Envoys, apps, Prometheus, Grafana).
# RUST_IMAGE and RUNTIME_IMAGE pick the base images (--build-arg); the defaults
# are the public images. Target `runtime` is the image without hdsd (for a
# binary mounted at /usr/local/bin/hdsd): tests/compose/offline.yml builds it on
# local stand-ins for an engine without a registry (see docs/operating.md,
# "Docker Compose").
ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# Everything but the binary (target `runtime`).
FROM ${RUNTIME_IMAGE} AS runtime
# ca-certificates: TLS to other services; curl: the HEALTHCHECK below.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 hdsd \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/hdsd --shell /usr/sbin/nologin hdsd \
 && mkdir -p /etc/hdsd/dataplanes /var/lib/hdsd /var/lib/hdsd-bootstrap \
 && chown 10001:10001 /var/lib/hdsd /var/lib/hdsd-bootstrap \
 && chmod 0700 /var/lib/hdsd
# Makes the signing key, tokens and Envoy bootstraps (docker-compose.yml's hdsd-init).
COPY docker/hdsd-init.sh /usr/local/bin/hdsd-init
COPY docker/hdsd.toml /etc/hdsd/hdsd.toml
RUN chmod 0755 /usr/local/bin/hdsd-init

USER 10001:10001
WORKDIR /var/lib/hdsd
# /var/lib/hdsd: state (signing keys, revocation list); /var/lib/hdsd-bootstrap: hdsd-init's output.
VOLUME ["/var/lib/hdsd"]
EXPOSE 5678 5680
# /healthz on the API listener; assumes api.listen's port is 5680 (the default).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:5680/healthz || exit 1
ENTRYPOINT ["hdsd"]
CMD ["serve", "--config", "/etc/hdsd/hdsd.toml"]

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# Dependencies first, in their own layer: editing src/ does not rebuild them.
# Cargo wants every target Cargo.toml names to exist: empty stand-ins for the
# binaries and benches (the benches' stay; `--bin hdsd` does not build them).
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin/hdsd-loadgen benches \
 && for f in src/main.rs src/bin/hdsd-loadgen/main.rs benches/specifier.rs benches/readiness.rs benches/instructions.rs; do \
      echo 'fn main() {}' > "$f"; done \
 && touch src/lib.rs \
 && cargo build --release --locked --bin hdsd \
 && rm -rf src target/release/.fingerprint/hdsd-* target/release/deps/hdsd-* target/release/deps/libhdsd-* target/release/hdsd
COPY src ./src
RUN cargo build --release --locked --bin hdsd \
 && ./target/release/hdsd --version

# The image: the runtime stage plus the hdsd built above.
FROM runtime
COPY --from=build /src/target/release/hdsd /usr/local/bin/hdsd
