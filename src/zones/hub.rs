//! What a global holds of every zone at once: which zones are registered
//! or disabled, each zone's [`RemoteZone`], how its streams went (snapshots
//! and resumes), and the summary every reader shows (REST, metrics, the
//! page). Plain data with one writer, the global's hub task, which feeds it
//! the [`session::Action`]s of every stream and publishes [`Hub::summaries`].
//!
//! The rules it adds to [`RemoteZone`]'s:
//!
//! - A zone is known when it is listed (`global.zones`), registered
//!   through the API ([`Hub::record`]: the store's rows, tombstones of
//!   deleted zones included), registered by the hub itself
//!   (`global.auto_register`, on [`Action::Register`]) or disabled
//!   (`global.disabled`, or through the API); a disabled zone is
//!   [`Registration::Disabled`] whatever else says. The configuration wins:
//!   the API refuses to change a zone it names, and a deletion written by
//!   another instance whose configuration differs only retires the zone's
//!   tokens here.
//! - A zone deleted through the API leaves the hub at once (readers see it
//!   leave: one zone deletion, its dataplanes with it); the streams of the
//!   zone that are open are told to end, and nothing they still send
//!   counts (they are revoked). A zone disabled through the API keeps its
//!   data, withdrawn, and its streams are told to end. A deleted zone's
//!   tokens issued until the deletion stay refused
//!   ([`Admission::tokens_not_before`]).
//! - A zone's data is **withdrawn** (every reader shows its inbounds not
//!   ready) while it is disabled, and once it has been offline for
//!   `offline_ttl`; before that an offline zone keeps its last readiness and
//!   readers show the zone's state beside it. Nothing is deleted because a
//!   zone went away.
//! - With several instances of the global (PostgreSQL), a zone whose
//!   stream another instance holds is fed from the shared store
//!   ([`Hub::observe`]): its link and dataplanes as that instance wrote
//!   them; a zone whose stream is held here ignores the store (its own
//!   news are newer).
//! - Streams get growing ids; a resume is counted when a stream wins the
//!   uplink with a revision to resume from, a snapshot when the holder's
//!   snapshot completes.
//!
//! [`session::Action`]: super::session::Action
//! [`Action::Register`]: super::session::Action::Register

use std::collections::BTreeMap;
use std::time::Duration;

use std::collections::BTreeSet;

use super::liveness::{Liveness, ZoneState};
use super::remote::{Applied, Claim, Dataplanes, ObservedLink, RemoteZone, StreamId};
use super::session::{Action, Admission, DisabledBy, Registration};
use super::{plus, Meshes};
use crate::clock::Timestamp;
use crate::dataplane::DataplaneId;
use crate::pb;
use crate::view::{DataplaneItem, RemoteZoneOf};

/// How the global judges its zones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubSettings {
    /// `global.zone_timeout`.
    pub zone_timeout: Duration,
    /// `global.offline_ttl`.
    pub offline_ttl: Duration,
    /// `global.auto_register`: a deleted zone that another instance
    /// accepted again (with a new token) is registered here too.
    pub auto_register: bool,
}

/// Where a zone registered through the API stands, as the store says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    Registered,
    Disabled,
    Deleted,
}

/// A zone's registration through the API: the store's row, as the hub
/// keeps it (the newest `seq` of each zone wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneRecord {
    pub zone: String,
    pub state: RecordState,
    /// The zone's last deletion: its tokens issued until then are refused.
    pub tokens_not_before: Option<Timestamp>,
    /// When the row changed (a disabled zone is disabled since then).
    pub changed_at: Timestamp,
    pub seq: i64,
}

/// Why the open streams of a zone must end after a [`ZoneRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Disabled through the API.
    Disabled(DisabledBy),
    /// Deleted through the API.
    Deleted,
    /// Its tokens until this time were retired (deleted by another instance
    /// whose configuration does not name it); only streams with such a
    /// token end.
    TokensRetired(Timestamp),
}

/// What applying a [`ZoneRecord`] asks of the driver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Tell these streams of the zone to end, for this reason.
    pub ending: Option<(Ending, Vec<StreamId>)>,
    /// The stream here that held the deleted zone's uplink (its link in
    /// the shared store is released).
    pub released: Option<StreamId>,
    /// Whether the record changed anything (older news changes nothing).
    pub applied: bool,
}

/// How a zone's streams went, since the global started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Streams that won the uplink.
    pub streams: u64,
    /// Streams that won it with a revision to resume from.
    pub resumes: u64,
    /// Snapshots completed.
    pub snapshots: u64,
}

/// One zone as readers see it at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneSummary {
    /// The zone's name.
    pub name: String,
    /// Its liveness at the moment of the summary.
    pub liveness: Liveness,
    /// Listed, registered through the API or by the hub, or disabled
    /// (false: only seen).
    pub registered: bool,
    /// How it is registered: `config` (global.zones or global.disabled),
    /// `api`, or `auto` (global.auto_register, or accepted by another
    /// instance of the global).
    pub registered_by: Option<&'static str>,
    /// The zone instance holding the uplink, while one does.
    pub instance: Option<String>,
    /// The instance of the global holding the zone's stream, when it is
    /// another one (several global instances on PostgreSQL).
    pub held_by: Option<String>,
    /// The zone revision the global holds complete (`None`: syncing).
    pub held: Option<u64>,
    /// The zone's dataplanes the global holds.
    pub dataplanes: usize,
    /// Their inbounds, ready and in all (withdrawn: none ready).
    pub inbounds_ready: usize,
    /// Their inbounds in all.
    pub inbounds_total: usize,
    /// True when readers must show every inbound of the zone not ready.
    pub withdrawn: bool,
    /// How its streams went.
    pub counters: Counters,
}

/// One zone in a [`ZonesView`]: its summary and the dataplanes the global
/// holds of it, as the zone sent them.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneView {
    /// The zone at the moment of the view.
    pub summary: ZoneSummary,
    /// Its dataplanes, sorted by mesh, then name: the hub's persistent map
    /// (shared between views; a reader diffs two views at the cost of what
    /// changed).
    pub dataplanes: Dataplanes,
}

impl ZoneView {
    /// How readers show the zone's dataplanes.
    pub fn zone_of(&self) -> RemoteZoneOf<'_> {
        RemoteZoneOf {
            name: &self.summary.name,
            state: self.summary.liveness.state.as_str(),
            withdrawn: self.summary.withdrawn,
        }
    }

    /// The zone's dataplanes as REST items (with their zone and, when
    /// withdrawn, not ready).
    pub fn items(&self) -> impl Iterator<Item = DataplaneItem> + '_ {
        let zone = self.zone_of();
        self.dataplanes
            .values()
            .filter_map(move |dp| DataplaneItem::from_remote(zone, dp))
    }
}

/// What a global's readers see of every zone at one moment: published by
/// the hub task on a watch channel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ZonesView {
    /// Every known zone, by name.
    pub zones: Vec<ZoneView>,
    /// True once every registered zone has completed a snapshot, is
    /// offline or disabled, or `zone_timeout` has passed since the global
    /// started: until then an assignment may lack a zone only because the
    /// global has not heard from it yet, and EDS holds its answers back.
    pub synced: bool,
}

impl ZonesView {
    /// One zone by name.
    pub fn get(&self, zone: &str) -> Option<&ZoneView> {
        self.zones
            .binary_search_by(|z| z.summary.name.as_str().cmp(zone))
            .ok()
            .map(|i| &self.zones[i])
    }

    /// Every zone's dataplanes as REST items, zone by zone.
    pub fn items(&self) -> impl Iterator<Item = DataplaneItem> + '_ {
        self.zones.iter().flat_map(ZoneView::items)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    remote: RemoteZone,
    /// In `global.zones`.
    listed: bool,
    /// In `global.disabled`, since the global started.
    config_disabled: Option<Timestamp>,
    /// Disabled through the API, since then.
    api_disabled: Option<Timestamp>,
    /// Registered by the hub (`auto_register`), or accepted by another
    /// instance of the global.
    auto: bool,
    counters: Counters,
}

impl Entry {
    fn disabled(&self) -> Option<Timestamp> {
        self.config_disabled.or(self.api_disabled)
    }

    fn config_names(&self) -> bool {
        self.listed || self.config_disabled.is_some()
    }
}

/// Every zone the global knows.
#[derive(Debug, Clone)]
pub struct Hub {
    settings: HubSettings,
    started: Timestamp,
    zones: BTreeMap<String, Entry>,
    /// Registrations through the API, by zone (deleted ones included).
    records: BTreeMap<String, ZoneRecord>,
    /// The open streams and their zone.
    streams: BTreeMap<StreamId, String>,
    /// Open streams of a zone deleted since they opened: nothing they send
    /// counts.
    revoked: BTreeSet<StreamId>,
    next_stream: StreamId,
}

impl Hub {
    /// The zones of the configuration (`registered`, `disabled`), at `now`.
    pub fn new(
        settings: HubSettings,
        registered: &[String],
        disabled: &[String],
        now: Timestamp,
    ) -> Hub {
        let mut hub = Hub {
            settings,
            started: now,
            zones: BTreeMap::new(),
            records: BTreeMap::new(),
            streams: BTreeMap::new(),
            revoked: BTreeSet::new(),
            next_stream: 1,
        };
        for zone in registered {
            hub.entry(zone).listed = true;
        }
        for zone in disabled {
            hub.entry(zone).config_disabled = Some(now);
        }
        hub
    }

    fn entry(&mut self, zone: &str) -> &mut Entry {
        let timeout = self.settings.zone_timeout;
        self.zones.entry(zone.to_string()).or_insert_with(|| Entry {
            remote: RemoteZone::new(zone, timeout),
            listed: false,
            config_disabled: None,
            api_disabled: None,
            auto: false,
            counters: Counters::default(),
        })
    }

    /// A number for a new stream of `zone`.
    pub fn open_stream(&mut self, zone: &str) -> StreamId {
        let id = self.next_stream;
        self.next_stream += 1;
        self.streams.insert(id, zone.to_string());
        id
    }

    /// `stream` ended: forgotten.
    pub fn close_stream(&mut self, stream: StreamId) {
        self.streams.remove(&stream);
        self.revoked.remove(&stream);
    }

    /// True when nothing `stream` sends counts any more (its zone was
    /// deleted while it was open).
    pub fn is_revoked(&self, stream: StreamId) -> bool {
        self.revoked.contains(&stream)
    }

    /// The open streams of `zone`, revoked ones left out.
    fn streams_of(&self, zone: &str) -> Vec<StreamId> {
        self.streams
            .iter()
            .filter(|(s, z)| z.as_str() == zone && !self.revoked.contains(s))
            .map(|(s, _)| *s)
            .collect()
    }

    /// What the registry says of `zone` when its stream opens.
    pub fn registration(&self, zone: &str) -> Admission {
        let record = self.records.get(zone);
        let entry = self.zones.get(zone);
        let registration = match (entry, record.map(|r| r.state)) {
            (Some(e), _) if e.config_disabled.is_some() => {
                Registration::Disabled(DisabledBy::Config)
            }
            // The configuration wins: a listed zone is enabled.
            (Some(e), _) if e.listed => Registration::Registered,
            (_, Some(RecordState::Disabled)) => Registration::Disabled(DisabledBy::Api),
            (Some(e), _) if e.auto => Registration::Registered,
            (_, Some(RecordState::Registered)) => Registration::Registered,
            _ => Registration::Unknown,
        };
        Admission {
            registration,
            tokens_not_before: record.and_then(|r| r.tokens_not_before),
        }
    }

    /// The registration through the API of `zone`, as last recorded.
    pub fn record_of(&self, zone: &str) -> Option<&ZoneRecord> {
        self.records.get(zone)
    }

    /// True when the configuration (`global.zones`, `global.disabled`)
    /// names `zone`.
    pub fn config_names(&self, zone: &str) -> bool {
        self.zones.get(zone).is_some_and(Entry::config_names)
    }

    /// Applies a registration through the API (from this instance's API or
    /// read from the shared store); a record not newer than the one held
    /// for the zone changes nothing. See the module's rules.
    pub fn record(&mut self, record: ZoneRecord) -> Recorded {
        if self
            .records
            .get(&record.zone)
            .is_some_and(|r| r.seq >= record.seq)
        {
            return Recorded::default();
        }
        let zone = record.zone.clone();
        let (state, changed_at) = (record.state, record.changed_at);
        let not_before = record.tokens_not_before;
        self.records.insert(zone.clone(), record);
        let mut recorded = Recorded {
            applied: true,
            ..Recorded::default()
        };
        match state {
            RecordState::Registered => {
                self.entry(&zone).api_disabled = None;
            }
            RecordState::Disabled => {
                let entry = self.entry(&zone);
                // The configuration wins (a listed zone stays enabled, a
                // disabled one is so already).
                if !entry.config_names() && entry.api_disabled.is_none() {
                    entry.api_disabled = Some(changed_at);
                    recorded.ending =
                        Some((Ending::Disabled(DisabledBy::Api), self.streams_of(&zone)));
                }
            }
            RecordState::Deleted if self.config_names(&zone) => {
                // The configuration here names it: it stays, only tokens
                // issued until the deletion stop.
                let entry = self.entry(&zone);
                entry.api_disabled = None;
                entry.auto = false;
                if let Some(t) = not_before {
                    recorded.ending = Some((Ending::TokensRetired(t), self.streams_of(&zone)));
                }
            }
            RecordState::Deleted => {
                let streams = self.streams_of(&zone);
                if let Some(entry) = self.zones.remove(&zone) {
                    recorded.released = entry.remote.own_link().map(|l| l.stream);
                }
                self.revoked.extend(streams.iter().copied());
                recorded.ending = Some((Ending::Deleted, streams));
            }
        }
        recorded
    }

    /// `stream` of `zone` asks for the uplink ([`RemoteZone::claim`]).
    pub fn claim(
        &mut self,
        zone: &str,
        stream: StreamId,
        epoch: u64,
        instance: &str,
        allowed: &Meshes,
        now: Timestamp,
    ) -> Claim {
        self.claim_from(zone, stream, epoch, instance, None, allowed, now)
    }

    /// [`Hub::claim`] by a stream from `peer` (a source is an instance and
    /// an address: see [`RemoteZone::claim_from`]).
    #[allow(clippy::too_many_arguments)]
    pub fn claim_from(
        &mut self,
        zone: &str,
        stream: StreamId,
        epoch: u64,
        instance: &str,
        peer: Option<std::net::IpAddr>,
        allowed: &Meshes,
        now: Timestamp,
    ) -> Claim {
        if self.is_revoked(stream) {
            return Claim::Lost {
                epoch: 0,
                instance: "nobody: the zone was deleted".to_string(),
            };
        }
        let entry = self.entry(zone);
        let claim = entry
            .remote
            .claim_from(stream, epoch, instance, peer, allowed, now);
        if let Claim::Won { resume_from, .. } = &claim {
            entry.counters.streams += 1;
            if resume_from.is_some() {
                entry.counters.resumes += 1;
            }
        }
        claim
    }

    /// Applies one action of `stream` of `zone`; returns the dataplanes
    /// readers must look at again.
    pub fn apply(&mut self, zone: &str, stream: StreamId, action: &Action) -> Vec<Applied> {
        if self.is_revoked(stream) {
            return Vec::new();
        }
        let entry = self.entry(zone);
        match action {
            Action::Register => {
                entry.auto = true;
                Vec::new()
            }
            Action::SnapshotComplete { .. } if entry.remote.holder() == Some(stream) => {
                entry.counters.snapshots += 1;
                entry.remote.apply(stream, action)
            }
            _ => entry.remote.apply(stream, action),
        }
    }

    /// What another instance of the global wrote of `zone` (several
    /// instances on PostgreSQL): its link, if it was read, and dataplanes
    /// (`None`: deleted); with `all`, `dataplanes` is the whole zone and
    /// what it lacks is deleted. Ignored while a stream here holds the
    /// zone. Returns the dataplanes readers must look at again, and whether
    /// anything moved.
    pub fn observe(
        &mut self,
        zone: &str,
        link: Option<ObservedLink>,
        dataplanes: Vec<(DataplaneId, Option<pb::Dataplane>)>,
        all: bool,
    ) -> (Vec<Applied>, bool) {
        // Rows of a zone deleted here that nothing registered again: left
        // over by a stream another instance accepted before it heard of
        // the deletion. Unless zones register themselves: then another
        // instance may have accepted it again, with a new token.
        let deleted = self
            .records
            .get(zone)
            .is_some_and(|r| r.state == RecordState::Deleted);
        if deleted && !self.zones.contains_key(zone) && !self.settings.auto_register {
            return (Vec::new(), false);
        }
        let entry = self.entry(zone);
        // Another instance accepted it: registered there, so here too.
        entry.auto = true;
        let moved = link.is_some_and(|l| entry.remote.observe_link(l));
        let applied = if all {
            entry.remote.observe_all(
                dataplanes
                    .into_iter()
                    .filter_map(|(id, dp)| Some((id, dp?)))
                    .collect(),
            )
        } else {
            dataplanes
                .into_iter()
                .filter_map(|(id, dp)| entry.remote.observe_dataplane(id, dp))
                .collect()
        };
        let moved = moved || !applied.is_empty();
        (applied, moved)
    }

    /// The shared store says `stream` no longer holds `zone` (another
    /// instance of the global took it): the stream's news stop counting
    /// here, as when it ends. True when it held it.
    pub fn lost(&mut self, zone: &str, stream: StreamId) -> bool {
        let Some(entry) = self.zones.get_mut(zone) else {
            return false;
        };
        if entry.remote.holder() != Some(stream) {
            return false;
        }
        entry.remote.apply(
            stream,
            &Action::End {
                code: super::Code::Superseded,
                reason: "another instance of the global holds the zone's stream".into(),
            },
        );
        true
    }

    /// What the global holds of `zone`.
    pub fn remote(&self, zone: &str) -> Option<&RemoteZone> {
        self.zones.get(zone).map(|e| &e.remote)
    }

    /// Every zone the global knows, by name, at `now`.
    pub fn summaries(&self, now: Timestamp) -> Vec<ZoneSummary> {
        self.zones
            .values()
            .map(|e| self.summary_of(e, now))
            .collect()
    }

    /// One zone at `now`.
    pub fn summary(&self, zone: &str, now: Timestamp) -> Option<ZoneSummary> {
        self.zones.get(zone).map(|e| self.summary_of(e, now))
    }

    /// Every zone at `now`, for readers. Each zone's dataplanes are shared
    /// with the hub (no copy, whatever the zone's size).
    pub fn view(&self, now: Timestamp) -> ZonesView {
        let zones = self
            .zones
            .values()
            .map(|e| ZoneView {
                summary: self.summary_of(e, now),
                dataplanes: e.remote.shared(),
            })
            .collect::<Vec<ZoneView>>();
        let waited = plus(self.started, self.settings.zone_timeout) <= now;
        let synced = waited
            || zones.iter().all(|z| {
                let s = &z.summary;
                !s.registered
                    || s.held.is_some()
                    || matches!(s.liveness.state, ZoneState::Offline | ZoneState::Disabled)
            });
        ZonesView { zones, synced }
    }

    fn summary_of(&self, e: &Entry, now: Timestamp) -> ZoneSummary {
        let liveness = e.remote.liveness(now, e.disabled());
        let record = self.records.get(e.remote.zone()).map(|r| r.state);
        let registered_by = if e.config_names() {
            Some("config")
        } else if matches!(
            record,
            Some(RecordState::Registered | RecordState::Disabled)
        ) {
            Some("api")
        } else if e.auto {
            Some("auto")
        } else {
            None
        };
        let withdrawn = match liveness.state {
            ZoneState::Disabled => true,
            ZoneState::Offline => liveness
                .since
                .is_some_and(|since| plus(since, self.settings.offline_ttl) <= now),
            ZoneState::Online | ZoneState::NeverConnected => false,
        };
        let (ready, total) = e.remote.inbounds();
        let ready = if withdrawn { 0 } else { ready };
        ZoneSummary {
            name: e.remote.zone().to_string(),
            liveness,
            registered: registered_by.is_some(),
            registered_by,
            instance: e.remote.uplink_instance().map(str::to_string),
            held_by: e.remote.elsewhere().map(str::to_string),
            held: e.remote.resume_from(),
            dataplanes: e.remote.len(),
            inbounds_ready: ready,
            inbounds_total: total,
            withdrawn,
            counters: e.counters,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::dataplane::DataplaneId;
    use crate::pb;

    const TIMEOUT: Duration = Duration::from_secs(15);
    const TTL: Duration = Duration::from_secs(300);

    fn at(secs: u64) -> Timestamp {
        plus(
            "2025-01-01T00:00:00Z".parse().unwrap(),
            Duration::from_secs(secs),
        )
    }

    fn hub(registered: &[&str], disabled: &[&str]) -> Hub {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Hub::new(
            HubSettings {
                zone_timeout: TIMEOUT,
                offline_ttl: TTL,
                auto_register: false,
            },
            &own(registered),
            &own(disabled),
            at(0),
        )
    }

    fn dp(name: &str, ready: bool) -> pb::Dataplane {
        pb::Dataplane {
            mesh: "default".into(),
            name: name.into(),
            address: "10.0.0.1".into(),
            inbounds: vec![pb::Inbound {
                port: 10001,
                service_port: 8080,
                service_address: "127.0.0.1".into(),
                health: Some(pb::Health {
                    ready,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ready,
            ..Default::default()
        }
    }

    fn id(name: &str) -> DataplaneId {
        DataplaneId::new("default", name)
    }

    /// Claims the uplink for a new stream at `now` and applies a snapshot of
    /// `dataplanes` (name, ready) through it.
    fn connect(
        h: &mut Hub,
        zone: &str,
        epoch: u64,
        now: u64,
        dataplanes: &[(&str, bool)],
    ) -> StreamId {
        let stream = h.open_stream(zone);
        let claim = h.claim(zone, stream, epoch, "zone-1", &Meshes::All, at(now));
        assert!(matches!(claim, Claim::Won { .. }), "{claim:?}");
        h.apply(zone, stream, &Action::Connected(at(now)));
        h.apply(zone, stream, &Action::SnapshotBegun);
        for (i, (name, ready)) in dataplanes.iter().enumerate() {
            h.apply(
                zone,
                stream,
                &Action::Upsert {
                    id: id(name),
                    dataplane: Box::new(dp(name, *ready)),
                    revision: i as u64 + 1,
                },
            );
        }
        let keep: BTreeSet<_> = dataplanes.iter().map(|(n, _)| id(n)).collect();
        h.apply(
            zone,
            stream,
            &Action::SnapshotComplete {
                keep,
                revision: dataplanes.len() as u64,
            },
        );
        stream
    }

    #[test]
    fn a_zone_is_known_by_the_configuration_or_by_registering() {
        let mut h = hub(&["eu-1"], &["us-1"]);
        assert_eq!(
            h.registration("eu-1").registration,
            Registration::Registered
        );
        assert_eq!(
            h.registration("us-1").registration,
            Registration::Disabled(DisabledBy::Config)
        );
        assert_eq!(h.registration("ap-1").registration, Registration::Unknown);
        let s = h.open_stream("ap-1");
        h.apply("ap-1", s, &Action::Register);
        assert_eq!(
            h.registration("ap-1").registration,
            Registration::Registered
        );
        // Disabled wins over listed.
        let h = hub(&["us-1"], &["us-1"]);
        assert_eq!(
            h.registration("us-1").registration,
            Registration::Disabled(DisabledBy::Config)
        );
        let names: Vec<_> = h.summaries(at(0)).into_iter().map(|z| z.name).collect();
        assert_eq!(names, ["us-1"]);
    }

    #[test]
    fn the_summary_counts_inbounds_and_the_first_stream_is_a_snapshot() {
        let mut h = hub(&["eu-1"], &[]);
        let before = h.summary("eu-1", at(0)).unwrap();
        assert_eq!(before.liveness.state, ZoneState::NeverConnected);
        assert_eq!((before.dataplanes, before.held), (0, None));
        connect(&mut h, "eu-1", 1, 1, &[("a", true), ("b", false)]);
        let z = h.summary("eu-1", at(2)).unwrap();
        assert_eq!(z.liveness.state, ZoneState::Online);
        assert_eq!(z.instance.as_deref(), Some("zone-1"));
        assert_eq!(
            (z.dataplanes, z.inbounds_ready, z.inbounds_total),
            (2, 1, 2)
        );
        assert_eq!(z.held, Some(2));
        assert_eq!(
            z.counters,
            Counters {
                streams: 1,
                resumes: 0,
                snapshots: 1
            }
        );
        assert!(!z.withdrawn);
    }

    #[test]
    fn an_offline_zone_keeps_its_readiness_until_the_ttl_then_reads_withdrawn() {
        let mut h = hub(&["eu-1"], &[]);
        connect(&mut h, "eu-1", 1, 0, &[("a", true)]);
        // Offline once the timeout ran out: the data stays, marked by the state.
        let z = h.summary("eu-1", at(16)).unwrap();
        assert_eq!(z.liveness.state, ZoneState::Offline);
        assert_eq!((z.inbounds_ready, z.withdrawn), (1, false));
        // Offline since 15 s: withdrawn from 315 s on, never deleted.
        let z = h.summary("eu-1", at(314)).unwrap();
        assert!(!z.withdrawn);
        let z = h.summary("eu-1", at(315)).unwrap();
        assert_eq!((z.dataplanes, z.inbounds_ready, z.withdrawn), (1, 0, true));
    }

    /// A view shares every zone's dataplanes with the hub: a zone that did
    /// not change is the same map in the next view, one that did is not;
    /// an offline zone's items show its state.
    #[test]
    fn a_view_shares_unchanged_zones_and_marks_each_item_with_its_zone() {
        let mut h = hub(&["eu-1", "us-1"], &[]);
        let eu = connect(&mut h, "eu-1", 1, 0, &[("a", true)]);
        connect(&mut h, "us-1", 1, 0, &[("b", true), ("c", false)]);
        let first = h.view(at(1));
        assert_eq!(first.zones.len(), 2);
        let us = first.get("us-1").unwrap();
        assert_eq!(us.dataplanes.len(), 2);
        assert_eq!(
            (us.summary.inbounds_ready, us.summary.inbounds_total),
            (1, 2)
        );
        h.apply(
            "eu-1",
            eu,
            &Action::Upsert {
                id: id("a"),
                dataplane: Box::new(dp("a", false)),
                revision: 2,
            },
        );
        let second = h.view(at(20));
        assert!(first
            .get("us-1")
            .unwrap()
            .dataplanes
            .ptr_eq(&second.get("us-1").unwrap().dataplanes));
        assert!(!first
            .get("eu-1")
            .unwrap()
            .dataplanes
            .ptr_eq(&second.get("eu-1").unwrap().dataplanes));
        assert_eq!(second.get("eu-1").unwrap().summary.inbounds_ready, 0);
        // At 20 s both zones are offline: the items carry the state.
        let items: Vec<_> = second.items().collect();
        assert_eq!(items.len(), 3);
        let zone = items[0].zone.as_ref().unwrap();
        assert_eq!(
            (zone.name.as_str(), zone.state.as_str()),
            ("eu-1", "offline")
        );
        assert!(second.get("ap-1").is_none());
    }

    /// A global that just started is not synced until every registered
    /// zone completed a snapshot (or is disabled), or `zone_timeout` passed.
    #[test]
    fn a_view_is_synced_once_every_registered_zone_is_complete_or_the_timeout_passed() {
        let mut h = hub(&["eu-1", "us-1"], &["off-1"]);
        assert!(!h.view(at(1)).synced);
        connect(&mut h, "eu-1", 1, 1, &[("a", true)]);
        assert!(!h.view(at(2)).synced, "us-1 not heard from");
        connect(&mut h, "us-1", 1, 2, &[]);
        assert!(h.view(at(3)).synced);
        // Or: nothing from us-1, but the timeout passed since the start.
        let mut h = hub(&["eu-1", "us-1"], &[]);
        connect(&mut h, "eu-1", 1, 1, &[("a", true)]);
        assert!(!h.view(at(14)).synced);
        assert!(h.view(at(15)).synced);
    }

    #[test]
    fn a_disabled_zone_is_withdrawn_at_once() {
        let mut h = hub(&[], &["eu-1"]);
        connect(&mut h, "eu-1", 1, 0, &[("a", true)]);
        let z = h.summary("eu-1", at(1)).unwrap();
        assert_eq!(z.liveness.state, ZoneState::Disabled);
        assert_eq!((z.inbounds_ready, z.withdrawn), (0, true));
    }

    #[test]
    fn a_reconnect_after_a_complete_snapshot_is_counted_as_a_resume() {
        let mut h = hub(&["eu-1"], &[]);
        let first = connect(&mut h, "eu-1", 1, 0, &[("a", true)]);
        h.apply(
            "eu-1",
            first,
            &Action::End {
                code: crate::zones::Code::ZoneTimeout,
                reason: "gone".into(),
            },
        );
        let second = h.open_stream("eu-1");
        let claim = h.claim("eu-1", second, 1, "zone-1", &Meshes::All, at(5));
        assert!(
            matches!(
                claim,
                Claim::Won {
                    resume_from: Some(1),
                    ..
                }
            ),
            "{claim:?}"
        );
        let z = h.summary("eu-1", at(5)).unwrap();
        assert_eq!(
            (z.counters.streams, z.counters.resumes, z.counters.snapshots),
            (2, 1, 1)
        );
        // Nothing was deleted by the reconnect.
        assert!(h.remote("eu-1").unwrap().get(&id("a")).is_some());
    }

    fn observed(held: Option<u64>, last: u64, holder: Option<&str>) -> ObservedLink {
        ObservedLink {
            epoch: 3,
            zone_instance: "zone-1".into(),
            held,
            snapshot: false,
            liveness: crate::zones::liveness::LivenessInputs {
                last_heartbeat: Some(at(last)),
                stream_opened: Some(at(0)),
                online_since: Some(at(0)),
                disabled: None,
            },
            holder: holder.map(str::to_string),
        }
    }

    /// A zone whose stream another instance of the global holds: its link
    /// and dataplanes come from the shared store, its liveness from the
    /// times written there; a full read deletes what it lacks.
    #[test]
    fn a_zone_held_by_another_instance_is_read_from_the_store() {
        let mut h = hub(&["eu-1"], &[]);
        let (applied, moved) = h.observe(
            "eu-1",
            Some(observed(Some(7), 10, Some("g2/1"))),
            vec![
                (id("a"), Some(dp("a", true))),
                (id("b"), Some(dp("b", false))),
            ],
            false,
        );
        assert!(moved);
        assert_eq!(
            applied,
            vec![Applied::Changed(id("a")), Applied::Changed(id("b"))]
        );
        let z = h.summary("eu-1", at(11)).unwrap();
        assert_eq!(z.liveness.state, ZoneState::Online);
        assert_eq!(z.held_by.as_deref(), Some("g2/1"));
        assert_eq!(z.instance.as_deref(), Some("zone-1"));
        assert_eq!(
            (z.held, z.inbounds_ready, z.inbounds_total),
            (Some(7), 1, 2)
        );
        // Heartbeats stop being written: offline here on time, too.
        let late = h
            .summary("eu-1", at(10) + TIMEOUT + Duration::from_secs(1))
            .unwrap();
        assert_eq!(late.liveness.state, ZoneState::Offline);
        // A full read without b deletes it; a tombstone of a deletes it.
        let (applied, _) = h.observe("eu-1", None, vec![(id("a"), Some(dp("a", true)))], true);
        assert_eq!(applied, vec![Applied::Deleted(id("b"))]);
        let (applied, _) = h.observe("eu-1", None, vec![(id("a"), None)], false);
        assert_eq!(applied, vec![Applied::Deleted(id("a"))]);
    }

    /// A stream here that claims a zone read from the store resumes from
    /// the revision written there; from then on the store's rows of the
    /// zone are ignored here, until the store says another claim took it.
    #[test]
    fn a_claim_here_resumes_from_the_store_and_then_ignores_it_until_lost() {
        let mut h = hub(&["eu-1"], &[]);
        h.observe(
            "eu-1",
            Some(observed(Some(7), 10, None)),
            vec![(id("a"), Some(dp("a", true)))],
            false,
        );
        let stream = h.open_stream("eu-1");
        let claim = h.claim("eu-1", stream, 3, "zone-1", &Meshes::All, at(11));
        assert!(
            matches!(
                claim,
                Claim::Won {
                    resume_from: Some(7),
                    ..
                }
            ),
            "{claim:?}"
        );
        let (_, moved) = h.observe(
            "eu-1",
            Some(observed(Some(9), 12, Some("g2/1"))),
            vec![(id("a"), None)],
            false,
        );
        assert!(!moved, "a zone held here ignores the store");
        assert!(h.remote("eu-1").unwrap().get(&id("a")).is_some());
        assert!(h.summary("eu-1", at(12)).unwrap().held_by.is_none());
        assert!(h.lost("eu-1", stream));
        assert!(!h.lost("eu-1", stream), "lost once");
        let (_, moved) = h.observe(
            "eu-1",
            Some(observed(Some(9), 12, Some("g2/1"))),
            vec![],
            false,
        );
        assert!(moved);
        assert_eq!(
            h.summary("eu-1", at(12)).unwrap().held_by.as_deref(),
            Some("g2/1")
        );
    }

    #[test]
    fn a_stream_that_lost_the_uplink_counts_no_snapshot() {
        let mut h = hub(&["eu-1"], &[]);
        connect(&mut h, "eu-1", 2, 0, &[("a", true)]);
        let old = h.open_stream("eu-1");
        let claim = h.claim("eu-1", old, 1, "zone-0", &Meshes::All, at(1));
        assert!(matches!(claim, Claim::Lost { epoch: 2, .. }), "{claim:?}");
        h.apply(
            "eu-1",
            old,
            &Action::SnapshotComplete {
                keep: BTreeSet::new(),
                revision: 9,
            },
        );
        let z = h.summary("eu-1", at(1)).unwrap();
        assert_eq!((z.counters.snapshots, z.dataplanes), (1, 1));
    }

    fn record(zone: &str, state: RecordState, not_before: Option<u64>, seq: i64) -> ZoneRecord {
        ZoneRecord {
            zone: zone.into(),
            state,
            tokens_not_before: not_before.map(at),
            changed_at: at(seq as u64),
            seq,
        }
    }

    /// A zone registered through the API is known (never connected until
    /// it dials), shown as registered by the API; an older row of it
    /// changes nothing.
    #[test]
    fn a_zone_registered_through_the_api_is_known_and_older_news_is_ignored() {
        let mut h = hub(&[], &[]);
        assert_eq!(h.registration("eu-1").registration, Registration::Unknown);
        let r = h.record(record("eu-1", RecordState::Registered, None, 2));
        assert_eq!(
            r,
            Recorded {
                applied: true,
                ..Recorded::default()
            }
        );
        assert_eq!(
            h.registration("eu-1").registration,
            Registration::Registered
        );
        let z = h.summary("eu-1", at(3)).unwrap();
        assert_eq!(z.liveness.state, ZoneState::NeverConnected);
        assert_eq!((z.registered, z.registered_by), (true, Some("api")));
        // The view waits for it like for a listed zone.
        assert!(!h.view(at(3)).synced);
        // Older (or the same) news from the store: ignored.
        assert!(
            !h.record(record("eu-1", RecordState::Deleted, Some(1), 1))
                .applied
        );
        assert!(
            !h.record(record("eu-1", RecordState::Deleted, Some(1), 2))
                .applied
        );
        assert_eq!(
            h.registration("eu-1").registration,
            Registration::Registered
        );
    }

    /// Disabled through the API: the zone's open streams are told to end,
    /// its data stays but reads withdrawn; enabled again, it is registered
    /// and no longer withdrawn.
    #[test]
    fn disabling_through_the_api_ends_the_streams_and_withdraws_the_data() {
        let mut h = hub(&[], &[]);
        h.record(record("eu-1", RecordState::Registered, None, 1));
        let stream = connect(&mut h, "eu-1", 1, 1, &[("a", true)]);
        let r = h.record(record("eu-1", RecordState::Disabled, None, 2));
        assert_eq!(
            r.ending,
            Some((Ending::Disabled(DisabledBy::Api), vec![stream]))
        );
        assert_eq!(
            h.registration("eu-1").registration,
            Registration::Disabled(DisabledBy::Api)
        );
        let z = h.summary("eu-1", at(3)).unwrap();
        assert_eq!(z.liveness.state, ZoneState::Disabled);
        assert_eq!(
            z.liveness.since,
            Some(at(2)),
            "disabled since the row changed"
        );
        assert_eq!((z.dataplanes, z.inbounds_ready, z.withdrawn), (1, 0, true));
        // Disabling it again ends nothing more.
        assert_eq!(
            h.record(record("eu-1", RecordState::Disabled, None, 3))
                .ending,
            None
        );
        h.apply(
            "eu-1",
            stream,
            &Action::End {
                code: crate::zones::Code::ZoneDisabled,
                reason: "disabled".into(),
            },
        );
        h.record(record("eu-1", RecordState::Registered, None, 4));
        assert_eq!(
            h.registration("eu-1").registration,
            Registration::Registered
        );
        let z = h.summary("eu-1", at(5)).unwrap();
        assert!(!z.withdrawn);
        assert_eq!(z.dataplanes, 1, "nothing deleted by a disable");
    }

    /// Deleted through the API: the zone leaves the view at once (one zone
    /// deletion for readers, no deletion per dataplane), its open streams
    /// are told to end and revoked (what they still send creates nothing),
    /// and its tokens until the deletion stay refused, also once it is
    /// registered again, from nothing.
    #[test]
    fn deleting_a_zone_removes_it_revokes_its_streams_and_retires_its_tokens() {
        let mut h = hub(&[], &[]);
        h.record(record("eu-1", RecordState::Registered, None, 1));
        let stream = connect(&mut h, "eu-1", 1, 1, &[("a", true), ("b", true)]);
        let before = h.view(at(2));
        let r = h.record(record("eu-1", RecordState::Deleted, Some(2), 2));
        assert_eq!(r.ending, Some((Ending::Deleted, vec![stream])));
        assert_eq!(r.released, Some(stream), "its link here is released");
        let after = h.view(at(2));
        assert!(after.get("eu-1").is_none());
        let changes = crate::zones::changes::changes(&before, &after);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].kind, crate::feed::ChangeKind::Deleted);
        assert!(matches!(
            &changes[0].subject,
            crate::feed::Subject::Zone { zone, .. } if &**zone == "eu-1"
        ));
        // The revoked stream's late news creates nothing.
        assert!(h.is_revoked(stream));
        h.apply(
            "eu-1",
            stream,
            &Action::Upsert {
                id: id("c"),
                dataplane: Box::new(dp("c", true)),
                revision: 9,
            },
        );
        assert!(h.summary("eu-1", at(3)).is_none());
        assert!(matches!(
            h.claim("eu-1", stream, 9, "zone-1", &Meshes::All, at(3)),
            Claim::Lost { .. }
        ));
        h.close_stream(stream);
        assert!(!h.is_revoked(stream));
        let admission = h.registration("eu-1");
        assert_eq!(admission.registration, Registration::Unknown);
        assert_eq!(admission.tokens_not_before, Some(at(2)));
        // Registered again: known from nothing, its old tokens still refused.
        h.record(record("eu-1", RecordState::Registered, Some(2), 3));
        let admission = h.registration("eu-1");
        assert_eq!(admission.registration, Registration::Registered);
        assert_eq!(admission.tokens_not_before, Some(at(2)));
        let z = h.summary("eu-1", at(4)).unwrap();
        assert_eq!(z.liveness.state, ZoneState::NeverConnected);
        assert_eq!((z.dataplanes, z.counters), (0, Counters::default()));
    }

    /// An auto-registered zone can be deleted too: it leaves, and with its
    /// old token it cannot register itself again.
    #[test]
    fn an_auto_registered_zone_can_be_deleted() {
        let mut h = hub(&[], &[]);
        let s = h.open_stream("ap-1");
        h.apply("ap-1", s, &Action::Register);
        assert_eq!(
            h.summary("ap-1", at(0)).unwrap().registered_by,
            Some("auto")
        );
        let r = h.record(record("ap-1", RecordState::Deleted, Some(1), 1));
        assert_eq!(r.ending, Some((Ending::Deleted, vec![s])));
        assert!(h.summary("ap-1", at(1)).is_none());
        assert_eq!(h.registration("ap-1").tokens_not_before, Some(at(1)));
    }

    /// The configuration wins: a deletion read from the store (written by
    /// an instance whose configuration differs) keeps a zone this
    /// configuration names, and only retires its tokens.
    #[test]
    fn a_deletion_of_a_zone_the_configuration_names_only_retires_its_tokens() {
        let mut h = hub(&["eu-1"], &[]);
        let stream = connect(&mut h, "eu-1", 1, 0, &[("a", true)]);
        let r = h.record(record("eu-1", RecordState::Deleted, Some(1), 1));
        assert_eq!(r.ending, Some((Ending::TokensRetired(at(1)), vec![stream])));
        assert_eq!(r.released, None);
        assert!(!h.is_revoked(stream));
        let z = h.summary("eu-1", at(1)).unwrap();
        assert_eq!((z.registered_by, z.dataplanes), (Some("config"), 1));
        assert_eq!(h.registration("eu-1").tokens_not_before, Some(at(1)));
        // Nor does a disable written elsewhere disable a listed zone.
        let r = h.record(record("eu-1", RecordState::Disabled, None, 2));
        assert_eq!(r.ending, None);
        assert_eq!(
            h.registration("eu-1").registration,
            Registration::Registered
        );
        assert_eq!(
            h.summary("eu-1", at(2)).unwrap().liveness.state,
            ZoneState::Online
        );
    }

    /// Rows another instance left of a zone deleted here (a stream it took
    /// before it heard of the deletion) are not a registration; with
    /// auto_register they are (another instance accepted the zone again).
    #[test]
    fn a_deleted_zone_is_not_registered_again_by_rows_of_another_instance() {
        let mut h = hub(&[], &[]);
        h.record(record("eu-1", RecordState::Registered, None, 1));
        h.record(record("eu-1", RecordState::Deleted, Some(1), 2));
        let (_, moved) = h.observe(
            "eu-1",
            Some(observed(Some(7), 10, Some("g2/1"))),
            vec![(id("a"), Some(dp("a", true)))],
            false,
        );
        assert!(!moved);
        assert!(h.summary("eu-1", at(11)).is_none());
        let mut h = Hub::new(
            HubSettings {
                zone_timeout: TIMEOUT,
                offline_ttl: TTL,
                auto_register: true,
            },
            &[],
            &[],
            at(0),
        );
        h.record(record("eu-1", RecordState::Deleted, Some(1), 2));
        let (_, moved) = h.observe(
            "eu-1",
            Some(observed(Some(7), 10, Some("g2/1"))),
            vec![(id("a"), Some(dp("a", true)))],
            false,
        );
        assert!(moved);
        assert_eq!(
            h.summary("eu-1", at(11)).unwrap().registered_by,
            Some("auto")
        );
    }
}
