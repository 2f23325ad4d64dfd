//! Zones over the network: the drivers of the pure machines in
//! [`crate::zones`].
//!
//! - [`global`]: the global's zone listener (`global.listen`, the gRPC
//!   `hdsd.v1.ZoneSyncService`): one task per stream drives a
//!   [`Session`](crate::zones::session::Session), and the hub task, the only
//!   writer of the [`Hub`](crate::zones::hub::Hub), publishes a
//!   [`ZonesView`](crate::zones::hub::ZonesView) that the REST API, the
//!   metrics and the page read.
//! - [`admin`]: zones registered, disabled, enabled and deleted through the
//!   API: written to the cluster, then applied by the hub.
//! - [`shared`]: with several instances of the global on PostgreSQL, the
//!   ledger task writes the zones whose streams this instance holds and
//!   hands the hub what the other instances wrote of theirs.
//! - [`uplink`]: the zone's side: one task dials the global (the URLs of
//!   `zone.global` in turn, with backoff), drives an
//!   [`Uplink`](crate::zones::uplink::Uplink) with the change feed and
//!   publishes how the link stands.

pub mod admin;
pub mod global;
pub mod shared;
pub mod uplink;

use std::time::Duration;

use crate::clock::Timestamp;

/// Completes once `drain` turns true (or its sender is gone).
async fn drained(drain: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = drain.wait_for(|d| *d).await;
}

/// How long until `deadline` (zero when it passed), for a tokio timer.
fn until(deadline: Timestamp, now: Timestamp) -> Duration {
    crate::zones::elapsed(now, deadline).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    /// The global refuses a heartbeat interval shorter than the one zones follow.
    #[test]
    fn the_configured_minimum_heartbeat_is_the_one_zones_follow() {
        assert_eq!(
            crate::config::MIN_ZONE_HEARTBEAT,
            crate::zones::uplink::MIN_HEARTBEAT_INTERVAL
        );
    }

    /// The global refuses timings longer than the ones zones follow, so no
    /// valid global is refused by its zones.
    #[test]
    fn the_configured_maximum_timings_are_the_ones_zones_follow() {
        use crate::zones::uplink::{MAX_HEARTBEAT_INTERVAL, MAX_ZONE_TIMEOUT};
        assert_eq!(crate::config::MAX_ZONE_HEARTBEAT, MAX_HEARTBEAT_INTERVAL);
        assert_eq!(crate::config::MAX_ZONE_TIMEOUT, MAX_ZONE_TIMEOUT);
    }
}
