//! Zones shared by the instances of a global (several instances on
//! PostgreSQL): the ledger task writes what the hub of this instance holds
//! of the zones whose streams it holds, and hands the hub what the other
//! instances wrote of theirs.
//!
//! Who owns what: the hub task is still the only writer of the `Hub`; the
//! ledger task owns the [`Ledger`] (which zone this instance claimed, at
//! which sequence number) and the writes not yet in the store. A zone
//! connects to any instance; the one that holds its stream writes the
//! zone's link (lease epoch, revision held, liveness times as ages on the
//! database's clock) and its dataplanes, and every instance answers for
//! every zone from them. A write that finds the link claimed by another
//! stream writes nothing and ends the stream here (`superseded`); the
//! store's rule is the same as one instance's: the higher epoch, the same
//! epoch again, or anyone once the zone is silent for `zone_timeout`.
//!
//! Zones registered, disabled or deleted through any instance's API are
//! rows of the store too: the ledger reads those written since the last it
//! saw, before the zones' rows, and hands them to the hub
//! ([`Report::Registrations`]); after any, it reads the zones' rows whole
//! (a zone registered again may have rows the hub skipped while it was
//! deleted here).
//!
//! When the store does not answer, writes are kept (coalesced per zone:
//! the last link state and the last version of each dataplane) and tried
//! again every [`RETRY`]; the hub goes on serving from memory meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::mpsc;

use crate::clock::{Clock, Timestamp};
use crate::cluster::{
    Cluster, LinkChange, LinkRow, LinkState, RegistrationState, Topic, Written, ZoneDataplaneRow,
    ZoneRegistration, ZoneWrite, ZonesRead,
};
use crate::dataplane::DataplaneId;
use crate::pb;
use crate::zones::global::hub::{RecordState, ZoneRecord};
use crate::zones::global::remote::{ObservedLink, OwnLink, StreamId};
use crate::zones::liveness::LivenessInputs;

/// How often writes that failed are tried again, and how often the store
/// is read even when no notification came.
pub const RETRY: Duration = Duration::from_secs(1);

/// What the hub asks the ledger to write of one zone.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub zone: String,
    pub stream: StreamId,
    pub change: Change,
    /// Dataplanes changed (`None`: deleted).
    pub dataplanes: Vec<(DataplaneId, Option<Arc<pb::Dataplane>>)>,
    /// The hub's clock when it asked (the ages of the link's times).
    pub at: Timestamp,
}

/// What becomes of the link.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The stream won the zone here.
    Claim(OwnLink),
    /// The holding stream's news.
    Update(OwnLink),
    /// The stream ended.
    Release,
}

/// What the other instances wrote of one zone.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedZone {
    pub zone: String,
    pub link: Option<ObservedLink>,
    pub dataplanes: Vec<(DataplaneId, Option<pb::Dataplane>)>,
}

/// What the ledger tells the hub.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// Zones other instances wrote; `all`: a full read (each zone's whole
    /// state).
    Observed { zones: Vec<ObservedZone>, all: bool },
    /// Zones registered, disabled or deleted through the API (of any
    /// instance), oldest first.
    Registrations(Vec<ZoneRecord>),
    /// `stream` no longer holds `zone` in the store.
    Lost {
        zone: String,
        stream: StreamId,
        /// Who holds it, when known.
        holder: Option<(u64, String)>,
    },
}

/// The hub's copy of a registration row.
pub fn record_of(row: ZoneRegistration) -> ZoneRecord {
    ZoneRecord {
        zone: row.zone,
        state: match row.state {
            RegistrationState::Registered => RecordState::Registered,
            RegistrationState::Disabled => RecordState::Disabled,
            RegistrationState::Deleted => RecordState::Deleted,
        },
        tokens_not_before: row.tokens_not_before,
        changed_at: row.changed_at,
        seq: row.seq,
    }
}

/// The claim string of a stream of `instance`.
pub fn claim_of(instance: &str, stream: StreamId) -> String {
    format!("{instance}#{stream}")
}

fn age(at: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    at.map(|t| crate::zones::elapsed(t, now).unwrap_or(Duration::ZERO))
}

fn link_state(link: &OwnLink, now: Timestamp) -> LinkState {
    LinkState {
        epoch: link.epoch,
        zone_instance: link.zone_instance.clone(),
        held: link.held,
        snapshot: link.snapshot,
        opened_age: age(link.liveness.stream_opened, now),
        heartbeat_age: age(link.liveness.last_heartbeat, now),
        online_since_age: age(link.liveness.online_since, now),
    }
}

/// The store's write of what the hub asked.
pub fn to_write(instance: &str, out: &Outgoing) -> ZoneWrite {
    let link = match &out.change {
        Change::Claim(l) => LinkChange::Claim(link_state(l, out.at)),
        Change::Update(l) => LinkChange::Update(link_state(l, out.at)),
        Change::Release => LinkChange::Release,
    };
    let mut upserts = Vec::new();
    let mut deletes = Vec::new();
    for (id, dp) in &out.dataplanes {
        match dp {
            Some(dp) => upserts.push((id.clone(), dp.encode_to_vec())),
            None => deletes.push(id.clone()),
        }
    }
    ZoneWrite {
        zone: out.zone.clone(),
        claim: claim_of(instance, out.stream),
        link,
        upserts,
        deletes,
    }
}

/// Writes as few as say the same: per zone and claim, in the order they
/// first appear, the latest link state (a claim stays a claim) with the
/// last version of each dataplane, then the release if one came.
pub fn coalesce(writes: Vec<ZoneWrite>) -> Vec<ZoneWrite> {
    #[derive(Default)]
    struct Merged {
        claim: bool,
        state: Option<LinkState>,
        release: bool,
        dataplanes: BTreeMap<DataplaneId, Option<Vec<u8>>>,
    }
    let mut order: Vec<(String, String)> = Vec::new();
    let mut merged: HashMap<(String, String), Merged> = HashMap::new();
    for w in writes {
        let key = (w.zone.clone(), w.claim.clone());
        let m = merged.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            Merged::default()
        });
        match w.link {
            LinkChange::Claim(s) => {
                m.claim = true;
                m.state = Some(s);
            }
            LinkChange::Update(s) => m.state = Some(s),
            LinkChange::Release => m.release = true,
        }
        for (id, body) in w.upserts {
            m.dataplanes.insert(id, Some(body));
        }
        for id in w.deletes {
            m.dataplanes.insert(id, None);
        }
    }
    let mut out = Vec::new();
    for key in order {
        let Some(m) = merged.remove(&key) else {
            continue;
        };
        let (zone, claim) = key;
        let mut upserts = Vec::new();
        let mut deletes = Vec::new();
        for (id, body) in m.dataplanes {
            match body {
                Some(b) => upserts.push((id, b)),
                None => deletes.push(id),
            }
        }
        if let Some(state) = m.state {
            out.push(ZoneWrite {
                zone: zone.clone(),
                claim: claim.clone(),
                link: if m.claim {
                    LinkChange::Claim(state)
                } else {
                    LinkChange::Update(state)
                },
                upserts: std::mem::take(&mut upserts),
                deletes: std::mem::take(&mut deletes),
            });
        }
        if m.release {
            out.push(ZoneWrite {
                zone,
                claim,
                link: LinkChange::Release,
                upserts,
                deletes,
            });
        }
    }
    out
}

/// Which zones this instance holds in the store, and since which sequence
/// number: plain data, the rules of whose rows are news.
#[derive(Debug, Default)]
pub struct Ledger {
    /// zone -> (stream, claim, the sequence number of its last write).
    held: HashMap<String, (StreamId, String, i64)>,
}

impl Ledger {
    /// Records what became of `write` (of `stream`); returns the lost
    /// claim as a report for the hub.
    pub fn written(
        &mut self,
        stream: StreamId,
        write: &ZoneWrite,
        result: Written,
    ) -> Option<Report> {
        match (result, &write.link) {
            (Written::Kept { seq }, LinkChange::Claim(_) | LinkChange::Update(_)) => {
                self.held
                    .insert(write.zone.clone(), (stream, write.claim.clone(), seq));
                None
            }
            (Written::Kept { .. }, LinkChange::Release) => {
                if self
                    .held
                    .get(&write.zone)
                    .is_some_and(|(_, c, _)| *c == write.claim)
                {
                    self.held.remove(&write.zone);
                }
                None
            }
            (Written::Lost, _) => {
                if self
                    .held
                    .get(&write.zone)
                    .is_some_and(|(_, c, _)| *c == write.claim)
                {
                    self.held.remove(&write.zone);
                }
                (!matches!(write.link, LinkChange::Release)).then(|| Report::Lost {
                    zone: write.zone.clone(),
                    stream,
                    holder: None,
                })
            }
        }
    }

    /// Sorts a read into what the hub must hear: the zones other instances
    /// write (this instance's own rows are no news), and the claims of this
    /// instance that another one has since overwritten (the link's row is
    /// newer than this instance's last write and names another claim).
    /// `now`: this instance's clock, for the rows' ages.
    pub fn read(&mut self, read: ZonesRead, now: Timestamp) -> Vec<Report> {
        let mut reports = Vec::new();
        let mut zones: BTreeMap<String, ObservedZone> = BTreeMap::new();
        for row in read.links {
            if let Some((stream, claim, seq)) = self.held.get(&row.zone).cloned() {
                if row.claim.as_deref() == Some(claim.as_str()) || row.seq <= seq {
                    continue;
                }
                self.held.remove(&row.zone);
                reports.push(Report::Lost {
                    zone: row.zone.clone(),
                    stream,
                    holder: row.instance.clone().map(|i| (row.state.epoch, i)),
                });
            }
            let zone = row.zone.clone();
            zones
                .entry(zone.clone())
                .or_insert_with(|| empty(&zone))
                .link = Some(observed_link(row, now));
        }
        for row in read.dataplanes {
            if self.held.contains_key(&row.zone) {
                continue;
            }
            let ZoneDataplaneRow { zone, id, body, .. } = row;
            let dataplane = match body.map(|b| pb::Dataplane::decode(b.as_slice())) {
                None => None,
                Some(Ok(dp)) => Some(dp),
                Some(Err(e)) => {
                    tracing::warn!(zone, dataplane = %id, "a zone dataplane in the shared store does not decode ({e}); skipped");
                    continue;
                }
            };
            zones
                .entry(zone.clone())
                .or_insert_with(|| empty(&zone))
                .dataplanes
                .push((id, dataplane));
        }
        if !zones.is_empty() || read.full {
            reports.push(Report::Observed {
                zones: zones.into_values().collect(),
                all: read.full,
            });
        }
        reports
    }
}

fn empty(zone: &str) -> ObservedZone {
    ObservedZone {
        zone: zone.to_string(),
        link: None,
        dataplanes: Vec::new(),
    }
}

/// A link row on this instance's clock.
fn observed_link(row: LinkRow, now: Timestamp) -> ObservedLink {
    let back = |age: Option<Duration>| {
        age.map(|a| now - chrono::Duration::from_std(a).unwrap_or(chrono::Duration::zero()))
    };
    ObservedLink {
        epoch: row.state.epoch,
        zone_instance: row.state.zone_instance,
        held: row.state.held,
        snapshot: row.state.snapshot,
        liveness: LivenessInputs {
            last_heartbeat: back(row.state.heartbeat_age),
            stream_opened: back(row.state.opened_age),
            online_since: back(row.state.online_since_age),
            disabled: None,
        },
        holder: row.claim.and(row.instance),
    }
}

/// Starts the ledger task: writes what `outgoing` brings, reads what the
/// other instances write (on each notification, every [`RETRY`], and in
/// full every `reconcile_interval` and after a lost claim), and hands the
/// hub its [`Report`]s.
pub fn spawn(
    cluster: Arc<dyn Cluster>,
    zone_timeout: Duration,
    clock: Arc<dyn Clock>,
    outgoing: mpsc::UnboundedReceiver<Vec<Outgoing>>,
    reports: mpsc::UnboundedSender<Report>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(cluster, zone_timeout, clock, outgoing, reports))
}

async fn run(
    cluster: Arc<dyn Cluster>,
    zone_timeout: Duration,
    clock: Arc<dyn Clock>,
    mut outgoing: mpsc::UnboundedReceiver<Vec<Outgoing>>,
    reports: mpsc::UnboundedSender<Report>,
) {
    let instance = cluster.instance().to_string();
    let mut ledger = Ledger::default();
    let mut signal = cluster.signal(Topic::Zones);
    let mut tick = tokio::time::interval(RETRY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut full = tokio::time::interval(cluster.reconcile_interval());
    full.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // (stream, write) not yet in the store.
    let mut pending: Vec<(StreamId, ZoneWrite)> = Vec::new();
    let mut batch = Vec::new();
    let mut last = 0i64;
    let mut last_registration = 0i64;
    let mut read_full = true;
    let mut failing = false;
    loop {
        let mut read = false;
        tokio::select! {
            n = outgoing.recv_many(&mut batch, 256) => {
                if n == 0 {
                    return;
                }
                for out in batch.drain(..).flatten() {
                    pending.push((out.stream, to_write(&instance, &out)));
                }
            }
            changed = signal.changed() => {
                if changed.is_err() {
                    return;
                }
                read = true;
            }
            _ = tick.tick() => read = true,
            _ = full.tick() => {
                read = true;
                read_full = true;
            }
        }
        if !pending.is_empty() {
            let streams: HashMap<String, StreamId> =
                pending.iter().map(|(s, w)| (w.claim.clone(), *s)).collect();
            let writes = coalesce(pending.drain(..).map(|(_, w)| w).collect());
            match cluster.write_zones(&writes, zone_timeout, read_full).await {
                Ok(results) => {
                    failing = false;
                    for (w, result) in writes.iter().zip(results) {
                        let stream = streams.get(&w.claim).copied().unwrap_or_default();
                        if let Some(report) = ledger.written(stream, w, result) {
                            tracing::info!(zone = w.zone, "another instance of the global took the zone's stream over; ending it here");
                            let _ = reports.send(report);
                            read = true;
                            read_full = true;
                        }
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!("cannot write the zones to the shared store: {e}; keeping them and retrying every {}s", RETRY.as_secs());
                    }
                    failing = true;
                    pending = writes
                        .into_iter()
                        .map(|w| (streams.get(&w.claim).copied().unwrap_or_default(), w))
                        .collect();
                }
            }
        }
        if read {
            // Registrations first: a zone registered again is known before
            // its rows are read.
            match cluster.zone_registrations(last_registration).await {
                Ok(rows) if !rows.is_empty() => {
                    last_registration = rows.iter().map(|r| r.seq).max().unwrap_or(0);
                    let _ = reports.send(Report::Registrations(
                        rows.into_iter().map(record_of).collect(),
                    ));
                    read_full = true;
                }
                Ok(_) => {}
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            "cannot read the zones registered through the API: {e}; retrying every {}s",
                            RETRY.as_secs()
                        );
                    }
                    failing = true;
                }
            }
            let from = if read_full { 0 } else { last };
            match cluster.zones_since(from).await {
                Ok(rows) => {
                    last = last.max(rows.seq);
                    read_full = false;
                    for report in ledger.read(rows, clock.now()) {
                        let _ = reports.send(report);
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            "cannot read the zones of the other instances: {e}; retrying every {}s",
                            RETRY.as_secs()
                        );
                    }
                    failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    fn state(epoch: u64, held: Option<u64>) -> LinkState {
        LinkState {
            epoch,
            zone_instance: "zone-a".into(),
            held,
            snapshot: false,
            opened_age: Some(Duration::from_secs(5)),
            heartbeat_age: Some(Duration::from_millis(200)),
            online_since_age: Some(Duration::from_secs(5)),
        }
    }

    fn write(zone: &str, claim: &str, link: LinkChange, up: &[&str], del: &[&str]) -> ZoneWrite {
        ZoneWrite {
            zone: zone.into(),
            claim: claim.into(),
            link,
            upserts: up
                .iter()
                .map(|n| (DataplaneId::new("default", *n), n.as_bytes().to_vec()))
                .collect(),
            deletes: del
                .iter()
                .map(|n| DataplaneId::new("default", *n))
                .collect(),
        }
    }

    fn link_row(zone: &str, claim: Option<&str>, seq: i64) -> LinkRow {
        LinkRow {
            zone: zone.into(),
            claim: claim.map(str::to_string),
            instance: claim.map(|c| c.split('#').next().unwrap_or_default().to_string()),
            state: state(3, Some(40)),
            seq,
        }
    }

    /// A burst of one claim's writes is one write: a claim stays a claim,
    /// the latest state wins, each dataplane's last version wins; a release
    /// comes after, on its own.
    #[test]
    fn writes_coalesce_per_zone_and_claim_in_order() {
        let merged = coalesce(vec![
            write(
                "eu-1",
                "g1#1",
                LinkChange::Claim(state(1, None)),
                &["web"],
                &[],
            ),
            write(
                "us-1",
                "g1#2",
                LinkChange::Update(state(2, Some(7))),
                &[],
                &["db"],
            ),
            write(
                "eu-1",
                "g1#1",
                LinkChange::Update(state(1, Some(9))),
                &["db"],
                &["web"],
            ),
            write("eu-1", "g1#1", LinkChange::Release, &[], &[]),
        ]);
        assert_eq!(
            merged,
            vec![
                write(
                    "eu-1",
                    "g1#1",
                    LinkChange::Claim(state(1, Some(9))),
                    &["db"],
                    &["web"]
                ),
                write("eu-1", "g1#1", LinkChange::Release, &[], &[]),
                write(
                    "us-1",
                    "g1#2",
                    LinkChange::Update(state(2, Some(7))),
                    &[],
                    &["db"]
                ),
            ]
        );
        assert!(coalesce(Vec::new()).is_empty());
    }

    /// The rows of a zone this instance holds are its own writes (no news);
    /// the other zones' rows reach the hub, times put on this clock.
    #[test]
    fn a_read_skips_own_zones_and_hands_on_the_others() {
        let mut ledger = Ledger::default();
        let own = write("eu-1", "g1#1", LinkChange::Claim(state(1, None)), &[], &[]);
        assert_eq!(ledger.written(1, &own, Written::Kept { seq: 10 }), None);
        let body = pb::Dataplane {
            mesh: "default".into(),
            name: "web".into(),
            ..Default::default()
        };
        let reports = ledger.read(
            ZonesRead {
                full: false,
                links: vec![
                    link_row("eu-1", Some("g1#1"), 10),
                    link_row("us-1", Some("g2#4"), 11),
                ],
                dataplanes: vec![
                    ZoneDataplaneRow {
                        zone: "eu-1".into(),
                        id: DataplaneId::new("default", "mine"),
                        body: Some(vec![]),
                        seq: 9,
                    },
                    ZoneDataplaneRow {
                        zone: "us-1".into(),
                        id: DataplaneId::new("default", "web"),
                        body: Some(body.encode_to_vec()),
                        seq: 12,
                    },
                    ZoneDataplaneRow {
                        zone: "us-1".into(),
                        id: DataplaneId::new("default", "old"),
                        body: None,
                        seq: 13,
                    },
                ],
                seq: 13,
            },
            t0(),
        );
        let [Report::Observed { zones, all: false }] = reports.as_slice() else {
            panic!("{reports:?}");
        };
        assert_eq!(zones.len(), 1, "{zones:?}");
        let us = &zones[0];
        assert_eq!(us.zone, "us-1");
        let link = us.link.as_ref().unwrap();
        assert_eq!(link.holder.as_deref(), Some("g2"));
        assert_eq!((link.epoch, link.held), (3, Some(40)));
        assert_eq!(
            link.liveness.last_heartbeat,
            Some(t0() - chrono::Duration::milliseconds(200))
        );
        assert_eq!(
            us.dataplanes,
            vec![
                (DataplaneId::new("default", "web"), Some(body)),
                (DataplaneId::new("default", "old"), None)
            ]
        );
    }

    /// A newer row naming another claim means another instance took the
    /// zone: the stream here is reported lost, and the zone's rows are news
    /// from then on. An older row (read before this instance's claim
    /// committed) is not.
    #[test]
    fn a_newer_row_of_another_claim_loses_the_zone_here() {
        let mut ledger = Ledger::default();
        let own = write("eu-1", "g1#1", LinkChange::Claim(state(1, None)), &[], &[]);
        ledger.written(1, &own, Written::Kept { seq: 10 });
        let older = ledger.read(
            ZonesRead {
                links: vec![link_row("eu-1", Some("g2#3"), 8)],
                seq: 8,
                ..ZonesRead::default()
            },
            t0(),
        );
        assert!(older.is_empty(), "{older:?}");
        let newer = ledger.read(
            ZonesRead {
                links: vec![link_row("eu-1", Some("g2#3"), 11)],
                seq: 11,
                ..ZonesRead::default()
            },
            t0(),
        );
        assert_eq!(
            newer[0],
            Report::Lost {
                zone: "eu-1".into(),
                stream: 1,
                holder: Some((3, "g2".into()))
            }
        );
        assert!(matches!(&newer[1], Report::Observed { zones, .. } if zones[0].zone == "eu-1"));
    }

    /// A write the store refused (another claim holds the link) reports the
    /// stream lost; a refused release does not (the stream is gone anyway).
    #[test]
    fn a_refused_write_reports_the_stream_lost() {
        let mut ledger = Ledger::default();
        let update = write("eu-1", "g1#1", LinkChange::Update(state(1, None)), &[], &[]);
        assert_eq!(
            ledger.written(1, &update, Written::Lost),
            Some(Report::Lost {
                zone: "eu-1".into(),
                stream: 1,
                holder: None
            })
        );
        let release = write("eu-1", "g1#1", LinkChange::Release, &[], &[]);
        assert_eq!(ledger.written(1, &release, Written::Lost), None);
    }

    /// The ages of a claim's times, taken at the hub's clock.
    #[test]
    fn a_write_carries_ages_not_times() {
        let link = OwnLink {
            stream: 2,
            epoch: 4,
            zone_instance: "zone-a".into(),
            held: Some(5),
            snapshot: false,
            liveness: LivenessInputs {
                last_heartbeat: Some(t0() - chrono::Duration::milliseconds(300)),
                stream_opened: Some(t0() - chrono::Duration::seconds(2)),
                online_since: Some(t0() - chrono::Duration::seconds(2)),
                disabled: None,
            },
        };
        let w = to_write(
            "g1",
            &Outgoing {
                zone: "eu-1".into(),
                stream: 2,
                change: Change::Claim(link),
                dataplanes: vec![(DataplaneId::new("default", "gone"), None)],
                at: t0(),
            },
        );
        assert_eq!(w.claim, "g1#2");
        let LinkChange::Claim(s) = &w.link else {
            panic!("{w:?}");
        };
        assert_eq!(s.heartbeat_age, Some(Duration::from_millis(300)));
        assert_eq!(s.opened_age, Some(Duration::from_secs(2)));
        assert_eq!(w.deletes, vec![DataplaneId::new("default", "gone")]);
    }
}
