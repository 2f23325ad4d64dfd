//! Who reads readiness: the consumers of the change feed ([`crate::feed`]).
//!
//! - [`watch`]: one watcher's pump from the feed to a bounded buffer.
//! - [`grpc`]: `hdsd.v1.ReadinessService` (`proto/hdsd/v1/readiness.proto`).
//! - [`sse`]: the same watch as Server-Sent Events (`GET /api/v1/watch`).
//! - [`services`]: per-service health by Kuma's rules.
//! - [`paging`]: the fleet list in pages, its filters and counts (pure).
//! - [`counts`]: the summary's and the services' counts, kept as the fleet
//!   changes by one task.
//! - [`eds`]: Envoy's EDS, per-service endpoints with their health.

pub mod counts;
pub mod eds;
pub mod grpc;
pub mod paging;
pub mod services;
pub mod sse;
pub mod watch;

/// Code generated from `proto/hdsd/v1/` at build time (the leaf module
/// [`crate::pb`], named here too for the readiness API's callers).
pub use crate::pb;
