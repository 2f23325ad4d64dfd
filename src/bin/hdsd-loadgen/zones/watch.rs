//! The global's side as a consumer sees it: gRPC `Watch` clients timing
//! each zone change until the global's event for it, and `ListZones` for
//! what the global holds of each zone.

use std::sync::Arc;

use hdsd::pb::readiness_service_client::ReadinessServiceClient;
use hdsd::pb::{ListZonesRequest, WatchRequest, Zone};
use tokio::sync::watch;

use super::sim::{dataplane_index, zone_index};
use crate::consumers::{follow, Flips, Tally};

/// Which dataplane a global's event names, as an index into [`Flips`]:
/// zone `z`'s dataplane `i` is `z * per_zone + i`.
#[derive(Debug, Clone)]
pub struct Layout {
    pub prefix: String,
    pub zones: usize,
    pub per_zone: usize,
}

impl Layout {
    pub fn index(&self, zone: &str, name: &str) -> Option<usize> {
        let z = zone_index(&self.prefix, zone).filter(|z| *z < self.zones)?;
        let i = dataplane_index(name).filter(|i| *i < self.per_zone)?;
        Some(z * self.per_zone + i)
    }
}

async fn client(api: &str) -> anyhow::Result<ReadinessServiceClient<tonic::transport::Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(api.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(ReadinessServiceClient::new(channel).max_decoding_message_size(256 << 20))
}

/// One `Watch` of every zone's dataplanes on the global's API, on its own
/// connection, until `stop`: a flip is seen when a CHANGED event for its
/// dataplane carries the readiness the flip made.
pub async fn watcher(
    api: String,
    layout: Layout,
    flips: Arc<Flips>,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let mut client = match client(&api).await {
        Ok(c) => c,
        Err(e) => return tally.failure(format!("connect: {e}")),
    };
    let count = layout.zones * layout.per_zone;
    follow(
        &mut client,
        WatchRequest::default(),
        count,
        |d| layout.index(&d.zone, &d.name),
        &flips,
        &tally,
        &mut stop,
    )
    .await
}

/// Every zone the global knows (`ListZones`).
pub async fn list_zones(api: &str) -> anyhow::Result<Vec<Zone>> {
    let mut client = client(api).await?;
    Ok(client
        .list_zones(ListZonesRequest {})
        .await?
        .into_inner()
        .items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_map_to_flip_indexes() {
        let l = Layout {
            prefix: "lz-".into(),
            zones: 2,
            per_zone: 100,
        };
        assert_eq!(l.index("lz-01", "dp-000007"), Some(7));
        assert_eq!(l.index("lz-02", "dp-000007"), Some(107));
        assert_eq!(l.index("lz-03", "dp-000007"), None, "not a simulated zone");
        assert_eq!(l.index("lz-02", "dp-000100"), None);
        assert_eq!(l.index("", "dp-000001"), None, "the global's own");
    }
}
