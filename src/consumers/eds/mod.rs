//! EDS: Envoy's `EndpointDiscoveryService` served from readiness, so that any
//! Envoy (an edge proxy, an ingress, another service's sidecar) takes a
//! service's endpoints from hdsd and an app that fails its checks leaves the
//! load-balancing set by itself.
//!
//! - [`assignment`]: readiness -> endpoints and `health_status` (pure).
//! - [`index`]: every service's assignment, kept from the change feed by one
//!   task; only the services a change touches are recomputed.
//! - [`protocol`]: the state-of-the-world protocol of one stream (pure).
//! - [`server`]: the gRPC service on the HDS listener.
//! - [`transport`]: its gRPC server, whose `StreamEndpoints` decoder skips
//!   names repeated from the previous request and all of the node but its id.

pub mod assignment;
pub mod index;
pub mod protocol;
pub mod server;
pub mod transport;

pub use assignment::{EdsOptions, Policy, StaleAs};
