//! One instance alone (the embedded default): nobody else claims streams,
//! beats or publishes, so what [`super::PgCluster`] keeps in shared rows
//! lives here in memory, for this process only. Revisions count up from
//! the process's start (a resume from before it is answered with RESYNC).
//! Zones registered through a global's API are the exception: they must
//! survive a restart, so [`Solo::persisting`] keeps them in the redb file
//! of `state_dir` ([`RedbStore`]).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use super::{
    Cluster, ClusterFuture, Holders, KeyPublication, Lease, Observe, RegistrationChange,
    RegistrationWrite, StreamNote, Swept, Topic, Written, ZoneRegistration, ZoneWrite, ZonesRead,
};
use crate::auth::SharedKey;
use crate::clock::{Clock as _, SystemClock};
use crate::feed::{Feed, HistoryLimits};
use crate::readiness::Timestamp;
use crate::registry::Claims;
use crate::store::RedbStore;

/// How often followers re-read a [`Solo`] cluster (nothing changes it but
/// this process, so rarely).
const SOLO_RECONCILE: Duration = Duration::from_secs(30);

/// A cluster of one.
#[derive(Debug)]
pub struct Solo {
    instance: String,
    state: Arc<Mutex<SoloState>>,
    notes: broadcast::Sender<StreamNote>,
    signals: [watch::Sender<()>; 5],
    /// Where zone registrations persist; `None`: in memory.
    redb: Option<Arc<RedbStore>>,
}

#[derive(Debug, Default)]
struct SoloState {
    registered: bool,
    holders: Holders,
    revoked: BTreeSet<String>,
    /// (kid, publisher) -> PEM.
    keys: BTreeMap<(String, String), String>,
    /// Lease name -> (held by this instance, the last epoch).
    leases: BTreeMap<String, (bool, u64)>,
    /// Zone registrations, without a redb file.
    registrations: BTreeMap<String, ZoneRegistration>,
    registration_seq: i64,
}

impl Solo {
    /// This process, named `instance`.
    pub fn new(instance: impl Into<String>) -> Solo {
        Solo {
            instance: instance.into(),
            state: Arc::default(),
            notes: broadcast::channel(1).0,
            signals: std::array::from_fn(|_| watch::channel(()).0),
            redb: None,
        }
    }

    /// This process, named `instance`, keeping zone registrations in `redb`.
    pub fn persisting(instance: impl Into<String>, redb: Arc<RedbStore>) -> Solo {
        Solo {
            redb: Some(redb),
            ..Solo::new(instance)
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SoloState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn poke(&self, topic: Topic) {
        self.signals[topic as usize].send_replace(());
    }
}

fn ready<T: Send + 'static>(value: T) -> ClusterFuture<'static, T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl Cluster for Solo {
    fn instance(&self) -> &str {
        &self.instance
    }

    fn shared(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "this instance alone".to_string()
    }

    fn claims(&self) -> Claims {
        let (state, instance) = (self.state.clone(), self.instance.clone());
        let holders = self.signals[Topic::Holders as usize].clone();
        Claims(Arc::new(move |id, at| {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            match at {
                Some(at) => {
                    state.holders.insert(id.clone(), (instance.clone(), at));
                }
                None => {
                    state.holders.remove(id);
                }
            }
            holders.send_replace(());
        }))
    }

    /// Nobody else attaches streams: no note ever comes.
    fn stream_notes(&self) -> broadcast::Receiver<StreamNote> {
        self.notes.subscribe()
    }

    fn holders(&self) -> ClusterFuture<'_, Holders> {
        ready(self.state().holders.clone())
    }

    fn heartbeat(&self) -> ClusterFuture<'_, bool> {
        let mut state = self.state();
        let missing = !state.registered;
        state.registered = true;
        ready(missing)
    }

    /// Nobody else can fall silent.
    fn sweep(&self, _timeout: Duration) -> ClusterFuture<'_, Swept> {
        ready(Vec::new())
    }

    fn leave(&self) -> ClusterFuture<'_, ()> {
        let mut state = self.state();
        state.holders.clear();
        state.registered = false;
        for (held, _) in state.leases.values_mut() {
            *held = false;
        }
        drop(state);
        self.poke(Topic::Holders);
        self.poke(Topic::Leases);
        ready(())
    }

    fn revoke<'a>(&'a self, jti: &'a str) -> ClusterFuture<'a, bool> {
        let added = self.state().revoked.insert(jti.to_string());
        self.poke(Topic::Revocations);
        ready(added)
    }

    fn revocations(&self) -> ClusterFuture<'_, Vec<String>> {
        ready(self.state().revoked.iter().cloned().collect())
    }

    /// Alone, no other instance can contest a publisher id.
    fn publish_keys<'a>(
        &'a self,
        publisher: &'a str,
        keys: &'a BTreeMap<String, String>,
        _alive_within: Duration,
    ) -> ClusterFuture<'a, KeyPublication> {
        let mut state = self.state();
        let before = state.keys.clone();
        state
            .keys
            .retain(|(kid, p), _| p != publisher || keys.contains_key(kid));
        for (kid, pem) in keys {
            state
                .keys
                .insert((kid.clone(), publisher.to_string()), pem.clone());
        }
        let changed = state.keys != before;
        drop(state);
        if changed {
            self.poke(Topic::Keys);
        }
        ready(if changed {
            KeyPublication::Changed
        } else {
            KeyPublication::Unchanged
        })
    }

    fn shared_keys(&self) -> ClusterFuture<'_, Vec<SharedKey>> {
        ready(
            self.state()
                .keys
                .iter()
                .map(|((kid, publisher), pem)| SharedKey {
                    kid: kid.clone(),
                    publisher: publisher.clone(),
                    public_pem: pem.clone(),
                })
                .collect(),
        )
    }

    /// Alone, no other instance reads the zones: every write holds.
    fn write_zones<'a>(
        &'a self,
        writes: &'a [ZoneWrite],
        _zone_timeout: Duration,
        _prune: bool,
    ) -> ClusterFuture<'a, Vec<Written>> {
        ready(writes.iter().map(|_| Written::Kept { seq: 0 }).collect())
    }

    /// Alone, no other instance writes zones.
    fn zones_since(&self, _seq: i64) -> ClusterFuture<'_, ZonesRead> {
        ready(ZonesRead::default())
    }

    /// Alone, nobody else asks: this instance holds every lease, with an
    /// epoch from the time it took it (in microseconds), above the one
    /// before it and, with a clock that does not go back, above those of
    /// earlier runs.
    fn acquire_lease<'a>(&'a self, name: &'a str, _timeout: Duration) -> ClusterFuture<'a, Lease> {
        let now = u64::try_from(SystemClock.now().timestamp_micros()).unwrap_or(0);
        let mut state = self.state();
        let (held, epoch) = state.leases.entry(name.to_string()).or_insert((false, 0));
        let taken = !*held;
        if taken {
            *held = true;
            *epoch = (*epoch + 1).max(now);
        }
        let epoch = *epoch;
        drop(state);
        if taken {
            self.poke(Topic::Leases);
        }
        ready(Lease {
            holder: Some(self.instance.clone()),
            epoch,
            holder_silent: Some(Duration::ZERO),
        })
    }

    fn release_lease<'a>(&'a self, name: &'a str) -> ClusterFuture<'a, bool> {
        let released = match self.state().leases.get_mut(name) {
            Some((held, _)) => std::mem::replace(held, false),
            None => false,
        };
        if released {
            self.poke(Topic::Leases);
        }
        ready(released)
    }

    fn change_zone_registration<'a>(
        &'a self,
        zone: &'a str,
        change: RegistrationChange,
    ) -> ClusterFuture<'a, RegistrationWrite> {
        let now = SystemClock.now();
        Box::pin(async move {
            let written = match &self.redb {
                Some(redb) => redb.change_zone_registration(zone, change, now).await?,
                None => {
                    let mut state = self.state();
                    let current = state.registrations.get(zone).cloned();
                    let before = current.as_ref().map(|c| c.state);
                    let seq = state.registration_seq + 1;
                    match crate::store::registrations::next(
                        zone,
                        current.as_ref(),
                        change,
                        now,
                        seq,
                    ) {
                        Some(row) => {
                            state.registration_seq = seq;
                            state.registrations.insert(zone.to_string(), row.clone());
                            RegistrationWrite {
                                registration: row,
                                before,
                            }
                        }
                        None => RegistrationWrite {
                            registration: current.expect("nothing changes only with a row"),
                            before,
                        },
                    }
                }
            };
            self.poke(Topic::Zones);
            Ok(written)
        })
    }

    fn zone_registrations(&self, seq: i64) -> ClusterFuture<'_, Vec<ZoneRegistration>> {
        Box::pin(async move {
            match &self.redb {
                Some(redb) => redb.zone_registrations(seq).await,
                None => {
                    let mut rows: Vec<ZoneRegistration> = self
                        .state()
                        .registrations
                        .values()
                        .filter(|r| r.seq > seq)
                        .cloned()
                        .collect();
                    rows.sort_by_key(|r| r.seq);
                    Ok(rows)
                }
            }
        })
    }

    fn signal(&self, topic: Topic) -> watch::Receiver<()> {
        self.signals[topic as usize].subscribe()
    }

    fn reconcile_interval(&self) -> Duration {
        SOLO_RECONCILE
    }

    /// Revisions count up from the process's start, in microseconds.
    fn feed(&self, limits: HistoryLimits, now: Timestamp) -> Feed {
        Feed::starting_at(limits, u64::try_from(now.timestamp_micros()).unwrap_or(0))
    }

    /// Nobody else writes readiness.
    fn follow_readiness(
        self: Arc<Self>,
        _observe: Observe,
        _watermark: Box<dyn Fn(u64) + Send>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(std::future::pending())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_single_instance_keeps_the_cluster_contract() {
        super::super::conformance::one_instance(&Solo::new("solo/1")).await;
    }

    #[tokio::test]
    async fn a_single_instance_keeps_the_lease_contract() {
        super::super::conformance::one_lease(&Solo::new("solo/1")).await;
    }

    #[tokio::test]
    async fn a_single_instance_persisting_to_redb_keeps_the_cluster_contract() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("readiness.redb");
        let redb = Arc::new(RedbStore::open(&path).unwrap());
        super::super::conformance::one_instance(&Solo::persisting("solo/1", redb)).await;
        // The registrations outlive the process (a new store on the file).
        let again = Solo::persisting("solo/2", Arc::new(RedbStore::open(&path).unwrap()));
        let kept = again.zone_registrations(0).await.unwrap();
        assert!(!kept.is_empty(), "registrations kept in the redb file");
    }

    #[tokio::test]
    async fn a_single_instance_feeds_nothing_and_sweeps_nobody() {
        let solo = Solo::new("solo/1");
        assert!(!solo.shared());
        assert!(solo.sweep(Duration::ZERO).await.unwrap().is_empty());
        let mut notes = solo.stream_notes();
        (solo.claims().0)(
            &crate::dataplane::DataplaneId::new("default", "web-01"),
            Some(SystemClock.now()),
        );
        assert!(matches!(
            notes.try_recv(),
            Err(broadcast::error::TryRecvError::Empty)
        ));
    }
}
