//! `GET /api/v1/watch`: the watch as Server-Sent Events, for scripts and
//! browsers. The same messages as the gRPC `Watch`; each event's `id` is its
//! revision, so a client's `Last-Event-ID` resumes where it stopped.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;

use super::watch::{Watches, CONSUMER_BUFFER};
use crate::feed::{ChangeKind, Event, FeedHandle, Filter, Message, Revision, Subject, Zones};

/// The query of `GET /api/v1/watch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    pub mesh: Option<String>,
    /// Dataplane names, comma-separated.
    pub names: Option<String>,
    /// Tags an inbound must carry, `k=v` comma-separated.
    pub selector: Option<String>,
    /// Resume after this revision (as `Last-Event-ID` does).
    pub since: Option<Revision>,
    /// On a global: absent or empty for every zone, `local` for its own
    /// dataplanes, a zone's name for that zone.
    pub zone: Option<String>,
}

/// Parses `k=v,k2=v2`.
pub fn parse_selector(s: &str) -> Result<BTreeMap<String, String>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(format!(
                "selector {pair:?} is not key=value; write e.g. selector=kuma.io/service=web"
            )),
        })
        .collect()
}

fn dataplane_json(e: &Event) -> Option<serde_json::Value> {
    let (mesh, name) = e.subject.mesh_name()?;
    let mut json = serde_json::json!({
        "mesh": mesh,
        "name": name,
        "revision": e.revision,
        "ready": e.ready,
    });
    if let Some(zone) = e.subject.zone() {
        json["zone"] = serde_json::Value::from(&**zone);
    }
    Some(json)
}

fn zone_json(e: &Event) -> Option<serde_json::Value> {
    let Subject::Zone { zone, state } = &e.subject else {
        return None;
    };
    let mut json = serde_json::json!({ "name": &**zone, "revision": e.revision });
    if e.kind == ChangeKind::Changed {
        json["state"] = serde_json::Value::from(*state);
    }
    Some(json)
}

/// One feed message as an SSE event: `event` is the type in lowercase, `data`
/// one JSON object, `id` the revision (none for `resync`).
pub fn to_sse(message: &Message) -> SseEvent {
    let (kind, data) = match message {
        Message::Snapshot { revision, items } => (
            "snapshot",
            serde_json::json!({
                "type": "SNAPSHOT",
                "revision": revision,
                "snapshot": items.iter().filter_map(|e| dataplane_json(e)).collect::<Vec<_>>(),
                "zones": items.iter().filter_map(|e| zone_json(e)).collect::<Vec<_>>(),
            }),
        ),
        Message::Synced { revision } => (
            "synced",
            serde_json::json!({ "type": "SYNCED", "revision": revision }),
        ),
        Message::Event(e) => match (e.kind, zone_json(e)) {
            (ChangeKind::Changed, None) => (
                "changed",
                serde_json::json!({ "type": "CHANGED", "revision": e.revision, "dataplane": dataplane_json(e) }),
            ),
            (ChangeKind::Deleted, None) => (
                "deleted",
                serde_json::json!({ "type": "DELETED", "revision": e.revision, "dataplane": dataplane_json(e) }),
            ),
            (ChangeKind::Changed, Some(zone)) => (
                "zone_changed",
                serde_json::json!({ "type": "ZONE_CHANGED", "revision": e.revision, "zone": zone }),
            ),
            (ChangeKind::Deleted, Some(zone)) => (
                "zone_deleted",
                serde_json::json!({ "type": "ZONE_DELETED", "revision": e.revision, "zone": zone }),
            ),
        },
        Message::Resync(reason) => (
            "resync",
            serde_json::json!({ "type": "RESYNC", "resyncReason": reason.as_str() }),
        ),
    };
    let event = SseEvent::default().event(kind).data(data.to_string());
    match message.revision() {
        Some(r) => event.id(r.to_string()),
        None => event,
    }
}

/// `GET /api/v1/watch?mesh=&names=a,b&selector=k=v&since=N`.
pub async fn handler(
    State(feed): State<FeedHandle>,
    State(watches): State<Watches>,
    headers: HeaderMap,
    Query(q): Query<WatchQuery>,
) -> Response {
    let selector = match q.selector.as_deref().map(parse_selector).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => return bad_request(&e),
    };
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().parse::<Revision>());
    let since = match last_event_id {
        Some(Ok(r)) => Some(r),
        Some(Err(_)) => {
            return bad_request("Last-Event-ID must be a revision (a number) this stream sent")
        }
        None => q.since,
    };
    let filter = Filter {
        mesh: q.mesh.filter(|m| !m.is_empty()),
        names: q
            .names
            .iter()
            .flat_map(|n| n.split(','))
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect(),
        selector,
        zones: Zones::from_param(q.zone.as_deref()),
    };
    let slot = match watches.admit(&filter) {
        Ok(slot) => slot,
        Err(refused) => {
            let status = match refused.limit {
                "max_watches" => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::BAD_REQUEST,
            };
            return (
                status,
                axum::Json(serde_json::json!({ "error": refused.message })),
            )
                .into_response();
        }
    };
    let rx = watches.start(slot, feed.clone(), filter, since, CONSUMER_BUFFER);
    let stream = ReceiverStream::new(rx).map(|m| Ok::<_, Infallible>(to_sse(&m)));
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn bad_request(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(serde_json::json!({ "error": message })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_and_bad_ones_say_how_to_write_them() {
        assert_eq!(
            parse_selector("kuma.io/service=web, version=v2").unwrap(),
            [
                ("kuma.io/service".to_string(), "web".to_string()),
                ("version".to_string(), "v2".to_string())
            ]
            .into()
        );
        assert!(parse_selector("web").unwrap_err().contains("key=value"));
    }
}
