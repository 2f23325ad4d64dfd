//! Who reads readiness: the consumers of the change feed ([`crate::feed`]).
//!
//! - [`watch`]: one watcher's pump from the feed to a bounded buffer.
//! - [`grpc`]: `hdsd.v1.ReadinessService` (`proto/hdsd/v1/readiness.proto`).
//! - [`sse`]: the same watch as Server-Sent Events (`GET /api/v1/watch`).
//! - [`services`]: per-service health by Kuma's rules.
//! - [`eds`]: Envoy's EDS, per-service endpoints with their health.

pub mod eds;
pub mod grpc;
pub mod services;
pub mod sse;
pub mod watch;

/// Code generated from `proto/hdsd/v1/readiness.proto` at build time.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("hdsd.v1");

    /// The encoded descriptors of `proto/`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/hdsd_v1_descriptor.bin"));
}
