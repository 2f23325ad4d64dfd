//! `/api/v1/zones`: on a global, every zone it knows (its state, when it was
//! last heard from, what the global holds of it); on a zone, its link to
//! the global. Read from the hub's published view and the uplink's status.
//!
//! On a global, zones are also registered (`PUT /api/v1/zones/{zone}`, body
//! `{"disabled": true}` optional), disabled and enabled (`POST
//! .../disable`, `.../enable`) and deleted (`DELETE`) here, through
//! [`ZoneAdmin`](crate::zones::global::admin::ZoneAdmin).

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{error, Zones};
use crate::clock::Timestamp;
use crate::dataplane::DataplaneId;
use crate::view::zones::ZoneSummary;
use crate::view::DataplaneItem;
use crate::zones::global::admin::{AdminError, Op};
use crate::zones::zone::link::UplinkStatus;

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
    /// Listed in `global.zones`, registered through the API or on first
    /// connect, or disabled.
    pub registered: bool,
    /// How: `config`, `api` or `auto` (absent when not registered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered_by: Option<&'static str>,
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
            registered_by: s.registered_by,
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
        &format!("zone {zone:?} is not known here: it is not in global.zones, not registered through the API (`hdsd zone add {zone}`) and never connected; GET /api/v1/zones lists the known ones"),
    )
}

/// The body of `PUT /api/v1/zones/{zone}` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneSpec {
    /// Register it disabled (its streams refused, its data withdrawn).
    #[serde(default)]
    pub disabled: bool,
}

/// What a write answers: the zone as readers now see it.
fn changed(status: StatusCode, zone: &str, item: Option<ZoneItem>) -> Response {
    match item {
        Some(item) => (status, Json(item)).into_response(),
        // Gone meanwhile (deleted through another instance).
        None => unknown_zone(zone),
    }
}

fn admin_error(e: AdminError) -> Response {
    let status = match &e {
        AdminError::InvalidName(..) => StatusCode::BAD_REQUEST,
        AdminError::InConfig(_) => StatusCode::CONFLICT,
        AdminError::Unknown { .. } => StatusCode::NOT_FOUND,
        AdminError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, &e.to_string())
}

async fn change(
    z: &Zones,
    zone: &str,
    op: Op,
) -> Result<crate::zones::global::admin::Changed, Response> {
    let Some(admin) = &z.admin else {
        return Err(error(StatusCode::NOT_FOUND, NOT_A_GLOBAL));
    };
    admin.change(zone, op).await.map_err(admin_error)
}

/// `PUT /api/v1/zones/{zone}`: registers a zone (201 when new, 200 when it
/// was registered already), enabled unless the body says
/// `{"disabled": true}`.
pub async fn put(
    State(z): State<Zones>,
    Path(zone): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let spec = if body.trim().is_empty() {
        ZoneSpec::default()
    } else {
        match serde_json::from_str::<ZoneSpec>(&body) {
            Ok(spec) => spec,
            Err(e) => {
                let sent = headers
                    .get(axum::http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("no content type");
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("the body is not a zone ({e}; sent as {sent}): send nothing, or JSON like {{\"disabled\": true}}"),
                );
            }
        }
    };
    match change(
        &z,
        &zone,
        Op::Add {
            disabled: spec.disabled,
        },
    )
    .await
    {
        Ok(done) => {
            let status = if done.created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            changed(status, &zone, done.zone.as_ref().map(ZoneItem::from))
        }
        Err(response) => response,
    }
}

/// `POST /api/v1/zones/{zone}/disable`.
pub async fn disable(State(z): State<Zones>, Path(zone): Path<String>) -> Response {
    match change(&z, &zone, Op::Disable).await {
        Ok(done) => changed(
            StatusCode::OK,
            &zone,
            done.zone.as_ref().map(ZoneItem::from),
        ),
        Err(response) => response,
    }
}

/// `POST /api/v1/zones/{zone}/enable`.
pub async fn enable(State(z): State<Zones>, Path(zone): Path<String>) -> Response {
    match change(&z, &zone, Op::Enable).await {
        Ok(done) => changed(
            StatusCode::OK,
            &zone,
            done.zone.as_ref().map(ZoneItem::from),
        ),
        Err(response) => response,
    }
}

/// `DELETE /api/v1/zones/{zone}`: the zone, its stream, its data and
/// series go; its tokens issued until now are refused from now on.
pub async fn delete(State(z): State<Zones>, Path(zone): Path<String>) -> Response {
    match change(&z, &zone, Op::Delete).await {
        Ok(done) => Json(serde_json::json!({
            "name": zone,
            "deleted": true,
            "tokensNotBefore": done.tokens_not_before,
        }))
        .into_response(),
        Err(response) => response,
    }
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
