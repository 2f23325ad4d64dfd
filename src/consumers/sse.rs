//! `GET /api/v1/watch`: the watch as Server-Sent Events, for scripts and
//! browsers. The same messages as the gRPC `Watch`; each event's `id` is its
//! revision, so a client's `Last-Event-ID` resumes where it stopped.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;

use super::watch::Watches;
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
    /// Send a snapshot as `snapshot` events of at most this many items
    /// (dataplanes and zones), `synced` after the last; absent or 0: one.
    pub snapshot_page_size: Option<u32>,
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

/// A dataplane as a watch event names it (`dataplane`, and each item of a
/// snapshot).
#[derive(Serialize)]
struct DataplaneJson<'a> {
    mesh: &'a str,
    name: &'a str,
    revision: Revision,
    ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    zone: Option<&'a str>,
}

fn dataplane_json(e: &Event) -> Option<DataplaneJson<'_>> {
    let (mesh, name) = e.subject.mesh_name()?;
    Some(DataplaneJson {
        mesh,
        name,
        revision: e.revision,
        ready: e.ready,
        zone: e.subject.zone().map(|z| &**z),
    })
}

/// A zone as a watch event names it (`zone`, and each of a snapshot's
/// `zones`); `state` only while it exists.
#[derive(Serialize)]
struct ZoneJson<'a> {
    name: &'a str,
    revision: Revision,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'static str>,
}

fn zone_json(e: &Event) -> Option<ZoneJson<'_>> {
    let Subject::Zone { zone, state } = &e.subject else {
        return None;
    };
    Some(ZoneJson {
        name: zone,
        revision: e.revision,
        state: (e.kind == ChangeKind::Changed).then_some(*state),
    })
}

/// The `data` of one SSE event: `type` in capitals, then the fields of that
/// type. Serialized straight to text: a snapshot of 100k dataplanes was a
/// tree of 100k JSON objects before it was text (about 20 MB per watcher at
/// 100k; the text alone is a third of that).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
enum Data<'a> {
    Snapshot {
        revision: Revision,
        snapshot: Items<'a, DataplaneJson<'a>>,
        zones: Items<'a, ZoneJson<'a>>,
    },
    Synced {
        revision: Revision,
    },
    Changed {
        revision: Revision,
        dataplane: Option<DataplaneJson<'a>>,
    },
    Deleted {
        revision: Revision,
        dataplane: Option<DataplaneJson<'a>>,
    },
    ZoneChanged {
        revision: Revision,
        zone: ZoneJson<'a>,
    },
    ZoneDeleted {
        revision: Revision,
        zone: ZoneJson<'a>,
    },
    Resync {
        #[serde(rename = "resyncReason")]
        reason: &'static str,
    },
}

/// The items of a snapshot that `pick` names, serialized as a JSON array as
/// they are read (no list of them is built).
struct Items<'a, T> {
    events: &'a [std::sync::Arc<Event>],
    pick: fn(&'a Event) -> Option<T>,
}

impl<'a, T: Serialize> Serialize for Items<'a, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.events.iter().filter_map(|e| (self.pick)(e)))
    }
}

/// One feed message as an SSE event: `event` is the type in lowercase, `data`
/// one JSON object, `id` the revision (none for `resync`, and none for
/// `snapshot`: a snapshot may come in pages and is whole at the `synced`
/// that follows it, which carries the same revision, so a client cut off
/// in the middle of one resumes from where it was before, never from a
/// snapshot it did not read whole).
pub fn to_sse(message: &Message) -> SseEvent {
    let (kind, data) = event_and_data(message);
    let event = SseEvent::default().event(kind).data(data);
    match (message, message.revision()) {
        (Message::Snapshot { .. }, _) | (_, None) => event,
        (_, Some(r)) => event.id(r.to_string()),
    }
}

/// The `event` and `data` of a message's SSE event.
fn event_and_data(message: &Message) -> (&'static str, String) {
    let (kind, data) = match message {
        Message::Snapshot { revision, items } => (
            "snapshot",
            Data::Snapshot {
                revision: *revision,
                snapshot: Items {
                    events: items,
                    pick: dataplane_json,
                },
                zones: Items {
                    events: items,
                    pick: zone_json,
                },
            },
        ),
        Message::Synced { revision } => (
            "synced",
            Data::Synced {
                revision: *revision,
            },
        ),
        Message::Event(e) => {
            let revision = e.revision;
            match (e.kind, zone_json(e)) {
                (ChangeKind::Changed, None) => (
                    "changed",
                    Data::Changed {
                        revision,
                        dataplane: dataplane_json(e),
                    },
                ),
                (ChangeKind::Deleted, None) => (
                    "deleted",
                    Data::Deleted {
                        revision,
                        dataplane: dataplane_json(e),
                    },
                ),
                (ChangeKind::Changed, Some(zone)) => {
                    ("zone_changed", Data::ZoneChanged { revision, zone })
                }
                (ChangeKind::Deleted, Some(zone)) => {
                    ("zone_deleted", Data::ZoneDeleted { revision, zone })
                }
            }
        }
        Message::Resync(reason) => (
            "resync",
            Data::Resync {
                reason: reason.as_str(),
            },
        ),
    };
    // Serializing borrowed strings and numbers cannot fail.
    (kind, serde_json::to_string(&data).unwrap_or_default())
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
    let page = q.snapshot_page_size.unwrap_or(0) as usize;
    let rx = watches.start(slot, feed.clone(), filter, since, page);
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

    fn data(message: &Message) -> (&'static str, serde_json::Value) {
        let (kind, data) = event_and_data(message);
        (kind, serde_json::from_str(&data).unwrap())
    }

    /// Every message's `data`, field by field, as docs/api.md gives them.
    #[test]
    fn each_message_is_one_json_object_named_by_its_type() {
        use serde_json::json;
        use std::sync::Arc;
        let text = "type: Dataplane\nmesh: default\nname: web-1\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n";
        let web = crate::dataplane::parse_documents(text).unwrap().remove(0);
        let local = Arc::new(Event {
            revision: 7,
            kind: ChangeKind::Changed,
            ready: true,
            subject: Subject::Local(Arc::new(web)),
        });
        let zone = |kind| {
            Arc::new(Event {
                revision: 9,
                kind,
                ready: false,
                subject: Subject::Zone {
                    zone: "eu-1".into(),
                    state: "online",
                },
            })
        };
        let snapshot = Message::Snapshot {
            revision: 9,
            items: vec![local.clone(), zone(ChangeKind::Changed)],
        };
        assert_eq!(
            data(&snapshot),
            (
                "snapshot",
                json!({
                    "type": "SNAPSHOT", "revision": 9,
                    "snapshot": [{"mesh": "default", "name": "web-1", "revision": 7, "ready": true}],
                    "zones": [{"name": "eu-1", "revision": 9, "state": "online"}],
                })
            )
        );
        assert_eq!(
            data(&Message::Synced { revision: 9 }),
            ("synced", json!({"type": "SYNCED", "revision": 9}))
        );
        assert_eq!(
            data(&Message::Event(local.clone())),
            (
                "changed",
                json!({"type": "CHANGED", "revision": 7,
                       "dataplane": {"mesh": "default", "name": "web-1", "revision": 7, "ready": true}})
            )
        );
        let deleted = Arc::new(Event {
            kind: ChangeKind::Deleted,
            ..(*local).clone()
        });
        assert_eq!(data(&Message::Event(deleted)).1["type"], "DELETED");
        assert_eq!(
            data(&Message::Event(zone(ChangeKind::Changed))),
            (
                "zone_changed",
                json!({"type": "ZONE_CHANGED", "revision": 9,
                       "zone": {"name": "eu-1", "revision": 9, "state": "online"}})
            )
        );
        assert_eq!(
            data(&Message::Event(zone(ChangeKind::Deleted))),
            (
                "zone_deleted",
                json!({"type": "ZONE_DELETED", "revision": 9, "zone": {"name": "eu-1", "revision": 9}})
            )
        );
        assert_eq!(
            data(&Message::Resync(crate::feed::ResyncReason::TooOld)),
            (
                "resync",
                json!({"type": "RESYNC", "resyncReason": "too_old"})
            )
        );
    }
}
