//! The cluster of instances sharing one PostgreSQL database: every duty is
//! a query of [`PgStore`] (rows of `hdsd_instances`, `hdsd_streams`,
//! `hdsd_revocations`, `hdsd_signing_keys`, `hdsd_leases`, readiness
//! watermarks, a global's zones and their registrations).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use super::{
    Cluster, ClusterFuture, Holders, KeyPublication, Lease, Observe, RegistrationChange,
    RegistrationWrite, StreamNote, Swept, Topic, Written, ZoneRegistration, ZoneWrite, ZonesRead,
};
use crate::auth::SharedKey;
use crate::dataplane::DataplaneId;
use crate::feed::{Feed, HistoryLimits};
use crate::readiness::Timestamp;
use crate::registry::Claims;
use crate::store::definitions::DefinitionStore;
use crate::store::postgres::PgStore;

/// Instances sharing one PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgCluster {
    store: Arc<PgStore>,
    /// `cluster.resume_slack`: how far a resumed watch replays.
    resume_slack: Duration,
}

impl PgCluster {
    pub fn new(store: Arc<PgStore>, resume_slack: Duration) -> PgCluster {
        PgCluster {
            store,
            resume_slack,
        }
    }
}

impl Cluster for PgCluster {
    fn instance(&self) -> &str {
        self.store.instance()
    }

    fn shared(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        DefinitionStore::describe(self.store.as_ref())
    }

    fn claims(&self) -> Claims {
        let claims = self.store.claim_sender();
        Claims(Arc::new(move |id: &DataplaneId, at| {
            let _ = claims.send((id.clone(), at));
        }))
    }

    fn stream_notes(&self) -> broadcast::Receiver<StreamNote> {
        self.store.replaced()
    }

    fn holders(&self) -> ClusterFuture<'_, Holders> {
        Box::pin(self.store.holders())
    }

    fn heartbeat(&self) -> ClusterFuture<'_, bool> {
        Box::pin(self.store.heartbeat())
    }

    fn sweep(&self, timeout: Duration) -> ClusterFuture<'_, Swept> {
        Box::pin(self.store.sweep(timeout))
    }

    fn leave(&self) -> ClusterFuture<'_, ()> {
        Box::pin(self.store.leave())
    }

    fn revoke<'a>(&'a self, jti: &'a str) -> ClusterFuture<'a, bool> {
        Box::pin(self.store.revoke(jti))
    }

    fn revocations(&self) -> ClusterFuture<'_, Vec<String>> {
        Box::pin(self.store.revocations())
    }

    fn publish_keys<'a>(
        &'a self,
        publisher: &'a str,
        keys: &'a BTreeMap<String, String>,
        alive_within: Duration,
    ) -> ClusterFuture<'a, KeyPublication> {
        Box::pin(self.store.publish_keys(publisher, keys, alive_within))
    }

    fn shared_keys(&self) -> ClusterFuture<'_, Vec<SharedKey>> {
        Box::pin(self.store.shared_keys())
    }

    fn write_zones<'a>(
        &'a self,
        writes: &'a [ZoneWrite],
        zone_timeout: Duration,
        prune: bool,
    ) -> ClusterFuture<'a, Vec<Written>> {
        Box::pin(self.store.write_zones(writes, zone_timeout, prune))
    }

    fn zones_since(&self, seq: i64) -> ClusterFuture<'_, ZonesRead> {
        Box::pin(self.store.zones_since(seq))
    }

    fn acquire_lease<'a>(&'a self, name: &'a str, timeout: Duration) -> ClusterFuture<'a, Lease> {
        Box::pin(self.store.acquire_lease(name, timeout))
    }

    fn release_lease<'a>(&'a self, name: &'a str) -> ClusterFuture<'a, bool> {
        Box::pin(self.store.release_lease(name))
    }

    fn change_zone_registration<'a>(
        &'a self,
        zone: &'a str,
        change: RegistrationChange,
    ) -> ClusterFuture<'a, RegistrationWrite> {
        Box::pin(self.store.change_zone_registration(zone, change))
    }

    fn zone_registrations(&self, seq: i64) -> ClusterFuture<'_, Vec<ZoneRegistration>> {
        Box::pin(self.store.zone_registrations(seq))
    }

    fn signal(&self, topic: Topic) -> watch::Receiver<()> {
        match topic {
            Topic::Holders => self.store.holders_signal(),
            Topic::Revocations => self.store.revocations_signal(),
            Topic::Keys => self.store.keys_signal(),
            Topic::Zones => self.store.zones_signal(),
            Topic::Leases => self.store.leases_signal(),
        }
    }

    fn reconcile_interval(&self) -> Duration {
        self.store.reconcile_interval()
    }

    /// Cluster time: the readiness follower's watermarks, valid on every
    /// instance within `cluster.resume_slack`.
    fn feed(&self, limits: HistoryLimits, _now: Timestamp) -> Feed {
        Feed::clustered(limits, self.resume_slack)
    }

    fn follow_readiness(
        self: Arc<Self>,
        observe: Observe,
        watermark: Box<dyn Fn(u64) + Send>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.store.clone().follow_readiness(observe, watermark))
    }
}
