//! The zones as a global's readers see them: what the hub task publishes
//! on its watch channel ([`ZonesView`]), one zone's summary and
//! dataplanes, its liveness at one moment and how its streams went. Plain
//! data: the hub (`zones::global::hub`) builds it, the liveness rule
//! (`zones::liveness::state`) computes [`Liveness`], and the REST API, the
//! gRPC API, EDS, the counts, the history, the metrics and the page read
//! it. [`changes`] turns two views into change-feed entries.

pub mod changes;

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{DataplaneItem, RemoteZoneOf};
use crate::clock::Timestamp;
use crate::dataplane::DataplaneId;
use crate::pb;

/// A zone's state, as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZoneState {
    /// No stream of the zone was ever accepted.
    NeverConnected,
    /// A message (or an accepted stream) within the zone timeout.
    Online,
    /// Nothing from the zone for longer than the zone timeout.
    Offline,
    /// An operator disabled the zone: its streams are refused.
    Disabled,
}

impl ZoneState {
    /// Every state.
    pub const ALL: [ZoneState; 4] = [
        ZoneState::NeverConnected,
        ZoneState::Online,
        ZoneState::Offline,
        ZoneState::Disabled,
    ];

    /// The API's word: "never_connected", "online", "offline", "disabled".
    pub const fn as_str(self) -> &'static str {
        match self {
            ZoneState::NeverConnected => "never_connected",
            ZoneState::Online => "online",
            ZoneState::Offline => "offline",
            ZoneState::Disabled => "disabled",
        }
    }
}

impl fmt::Display for ZoneState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A zone's state at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// The state.
    pub state: ZoneState,
    /// When the state began: for `online`, when the zone came online (never
    /// after `now`); for `offline`, the moment the timeout ran out
    /// (`max(last, opened) + timeout`); for `disabled`, when it was
    /// disabled; `None` for `never_connected`.
    pub since: Option<Timestamp>,
    /// The last sign of life, `max(last heartbeat, stream opened)`.
    pub last_seen: Option<Timestamp>,
    /// While online: the first moment the zone is offline if nothing
    /// arrives (one nanosecond after the timeout runs out), for a driver's
    /// timer. `None` otherwise.
    pub offline_at: Option<Timestamp>,
}

/// A zone's dataplanes as the global holds them: a persistent map, so a
/// view takes it without a copy and a reader finds what changed between two
/// views without visiting what they share ([`imbl::OrdMap::diff`]).
pub type Dataplanes = imbl::OrdMap<DataplaneId, Arc<pb::Dataplane>>;

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
