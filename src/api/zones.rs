//! `/api/v1/zones`: on a global, every zone it knows (its state, when it was
//! last heard from, what the global holds of it); on a zone, its link to
//! the global. Read from the hub's published view and the uplink's status.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::{error, Zones};
use crate::clock::Timestamp;
use crate::dataplane::DataplaneId;
use crate::view::DataplaneItem;
use crate::zone_sync::uplink::UplinkStatus;
use crate::zones::hub::ZoneSummary;

/// The `zone` filter of `/api/v1/dataplanes` that keeps the global's own
/// dataplanes (those with no zone).
pub const LOCAL: &str = crate::names::RESERVED_ZONE;

/// One zone as the API shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneItem {
    pub name: String,
    /// `online`, `offline`, `disabled` or `never_connected`.
    pub state: &'static str,
    /// When the state began (absent for `never_connected`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// The last message from the zone, on the global's clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Timestamp>,
    /// Listed in `global.zones`, registered on first connect, or disabled.
    pub registered: bool,
    /// The zone instance holding the uplink, while one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The instance of the global holding the zone's stream, when it is
    /// another one (several global instances on PostgreSQL; absent when it
    /// is this one, or nobody holds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// The zone revision the global holds complete (absent while syncing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    pub dataplanes: usize,
    pub inbounds: InboundCounts,
    /// True when every inbound of the zone reads not ready: the zone is
    /// disabled, or offline for longer than `global.offline_ttl`.
    pub withdrawn: bool,
    /// Streams that won the uplink, resumes among them, snapshots completed.
    pub streams: u64,
    pub resumes: u64,
    pub snapshots: u64,
}

/// Inbounds, ready and in all.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct InboundCounts {
    pub ready: usize,
    pub total: usize,
}

impl From<&ZoneSummary> for ZoneItem {
    fn from(s: &ZoneSummary) -> ZoneItem {
        ZoneItem {
            name: s.name.clone(),
            state: s.liveness.state.as_str(),
            since: s.liveness.since,
            last_seen: s.liveness.last_seen,
            registered: s.registered,
            instance: s.instance.clone(),
            held_by: s.held_by.clone(),
            revision: s.held,
            dataplanes: s.dataplanes,
            inbounds: InboundCounts {
                ready: s.inbounds_ready,
                total: s.inbounds_total,
            },
            withdrawn: s.withdrawn,
            streams: s.counters.streams,
            resumes: s.counters.resumes,
            snapshots: s.counters.snapshots,
        }
    }
}

/// The list: the zones a global knows, and a zone's uplink.
#[derive(Debug, Clone, Serialize)]
pub struct ZoneList {
    pub items: Vec<ZoneItem>,
    /// On a zone: its link to the global.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uplink: Option<UplinkStatus>,
}

pub async fn list(State(z): State<Zones>) -> Json<ZoneList> {
    let items = z.hub.as_ref().map_or_else(Vec::new, |hub| {
        hub.view()
            .zones
            .iter()
            .map(|zone| ZoneItem::from(&zone.summary))
            .collect()
    });
    Json(ZoneList {
        items,
        uplink: z.uplink.as_ref().map(|u| u.status()),
    })
}

const NOT_A_GLOBAL: &str = "this hdsd is not a global ([global] enabled = true): it knows no zones; a zone's link to its global is in GET /api/v1/zones (uplink) and /readyz";

fn unknown_zone(zone: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("zone {zone:?} is not known here: it is not in global.zones and never connected; GET /api/v1/zones lists the known ones"),
    )
}

pub async fn get(State(z): State<Zones>, Path(zone): Path<String>) -> Response {
    let Some(hub) = &z.hub else {
        return error(StatusCode::NOT_FOUND, NOT_A_GLOBAL);
    };
    match hub.view().get(&zone) {
        Some(view) => Json(ZoneItem::from(&view.summary)).into_response(),
        None => unknown_zone(&zone),
    }
}

/// `GET /api/v1/zones/{zone}/dataplanes/{mesh}/{name}`: one dataplane of a
/// zone, as `GET /api/v1/dataplanes/{mesh}/{name}` shows the global's own.
pub async fn get_dataplane(
    State(z): State<Zones>,
    Path((zone, mesh, name)): Path<(String, String, String)>,
) -> Response {
    let Some(hub) = &z.hub else {
        return error(StatusCode::NOT_FOUND, NOT_A_GLOBAL);
    };
    let view = hub.view();
    let Some(zone_view) = view.get(&zone) else {
        return unknown_zone(&zone);
    };
    let id = DataplaneId::new(mesh, name);
    match zone_view
        .dataplanes
        .get(&id)
        .and_then(|dp| DataplaneItem::from_remote(zone_view.zone_of(), dp))
    {
        Some(item) => Json(item).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            &format!(
                "dataplane {id} is not in zone {zone:?} as the global holds it; GET /api/v1/dataplanes?zone={zone} lists them"
            ),
        ),
    }
}
