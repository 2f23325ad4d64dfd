# Stand-in for rust:1-bookworm, the Dockerfile's builder: the host's Rust
# toolchain and its crates.io cache (the crates Cargo.lock names) on the
# Debian bookworm stand-in. Cargo runs offline: containers here reach no
# crates.io, and every crate the build needs is in the cache.
ARG BASE
FROM ${BASE}
COPY toolchain/ /usr/local/rust/
COPY cargo-home/ /usr/local/cargo/
ENV CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CARGO_NET_OFFLINE=true
RUN rustc --version && cargo --version
