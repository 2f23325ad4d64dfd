//! hdsd's integration tests, in one test binary (one link instead of one per
//! file: the build is faster and much smaller on disk). Each module drives the
//! real binary, real Envoys and the other real parts; run one with
//! `cargo test --test integration <module>::`.

mod support;

mod abuse_files;
mod abuse_network;
mod abuse_trust;
mod api_tls;
mod auth_envoy;
mod bootstrap;
mod compose;
mod compose_up;
mod eds_envoy;
mod envoy_core;
mod envoy_matrix;
mod fleet_paging;
mod hds_protocol;
mod kuma_files;
mod liveness;
mod loadgen_smoke;
mod observability;
mod packaging;
mod partitions;
mod probes_envoy;
mod probes_tls;
mod probes_validate;
mod quickstart;
mod readiness_api;
mod startup;
mod store_postgres;
// The faults need a build with the `fault-injection` feature (`make test`).
#[cfg(feature = "fault-injection")]
mod supervision;
mod tls_envoy;
mod ui_browser;
mod zones;
mod zones_eds;
