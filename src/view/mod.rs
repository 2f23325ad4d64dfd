//! The read model every reader shares, in one place: what REST, gRPC, SSE,
//! EDS, the counts, the history, the metrics, the CLI and the page show.
//!
//! - [`dataplane`]: a dataplane as readers see it ([`DataplaneItem`] and
//!   its parts), built from the registry's state.
//! - [`zones`]: a global's zones as its hub publishes them
//!   ([`ZonesView`](zones::ZonesView)), and the change-feed entries two
//!   views differ by.
//! - [`pb`]: these shapes as `hdsd.v1` protobuf, for the gRPC API and the
//!   zone's uplink.
//!
//! Plain data built from the state layer below; nothing here runs a task
//! or owns state.

pub mod dataplane;
pub mod pb;
pub mod zones;

pub use dataplane::*;
