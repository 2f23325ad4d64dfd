//! What the drivers of both sides ([`super::global::server`],
//! [`super::zone::link`]) wait on: the drain, and a deadline on the
//! machines' clock as a tokio timer's duration.

use std::time::Duration;

use crate::clock::Timestamp;

/// Completes once `drain` turns true (or its sender is gone).
pub(crate) async fn drained(drain: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = drain.wait_for(|d| *d).await;
}

/// How long until `deadline` (zero when it passed), for a tokio timer.
pub(crate) fn until(deadline: Timestamp, now: Timestamp) -> Duration {
    super::elapsed(now, deadline).unwrap_or(Duration::ZERO)
}
