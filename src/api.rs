//! The REST API (axum): dataplanes and their readiness, sources, health.
//!
//! Handlers only read snapshots: the catalog, each dataplane's watch value,
//! and the source snapshot. They never write state; the write calls of
//! [`definitions`] write to the store, whose changes reach the registry like
//! file changes.

pub mod definitions;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq as _;
use tokio::sync::watch;

use crate::auth::{bearer, BearerError};
use crate::dataplane::{DataplaneId, DataplaneKind, IgnoredDocument, InboundState, Listener};
use crate::readiness::Timestamp;
use crate::registry::{DataplaneState, Registry};
use crate::source::{FileError, Loaded};

/// What the API reads.
#[derive(Debug, Clone)]
pub struct ApiState {
    pub registry: Registry,
    pub sources: watch::Receiver<Arc<Loaded>>,
    /// Set once both listeners are bound and the dataplanes are loaded.
    pub ready: Arc<AtomicBool>,
    /// Extra lines for `/readyz`'s body (e.g. warnings about the setup).
    pub notes: Arc<Vec<String>>,
    /// Whether the shared store answers; `None` without one.
    pub store_status: Option<crate::store::StoreStatus>,
    /// Renders `/metrics`; absent when metrics are off (tests of the router alone).
    pub metrics: Option<crate::scrape::Scrape>,
    /// Bearer tokens that `/api/*` requires; empty means open (loopback only).
    pub tokens: Arc<Vec<String>>,
    /// Verifies dataplane tokens for `/api/v1/bootstrap`; `None` without token auth.
    pub gate: Option<Arc<crate::auth::Gate>>,
    /// The HDS listener's port, the default for bootstraps.
    pub hds_port: u16,
    /// The change feed, for `/api/v1/watch`.
    pub feed: crate::consumers::feed::FeedHandle,
    /// Where definitions come from: the write calls answer 409 for files.
    pub definitions: definitions::Definitions,
}

pub fn router(state: ApiState) -> Router {
    let api = Router::new()
        .route("/api/v1/dataplanes", get(list_dataplanes))
        .route(
            "/api/v1/dataplanes/{mesh}/{name}",
            get(get_dataplane)
                .put(definitions::put)
                .delete(definitions::delete),
        )
        .route("/api/v1/sources", get(sources))
        .route("/api/v1/services", get(list_services))
        .route("/api/v1/watch", get(crate::consumers::sse::handler))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ));
    Router::new()
        .merge(api)
        // The fleet page: public assets; its data comes from /api/* with the token.
        .merge(crate::ui::router())
        // Authenticated by the dataplane token itself, not by api.tokens.
        .route("/api/v1/bootstrap", get(bootstrap))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such endpoint; see the README's REST API reference",
            )
        })
        .with_state(state)
}

/// One dataplane as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataplaneItem {
    pub mesh: String,
    pub name: String,
    pub address: IpAddr,
    /// `sidecar`, `gateway` or `zone_proxy` (the last two usually have no
    /// inbounds: nothing to probe, ready once defined).
    #[serde(default = "sidecar")]
    pub kind: DataplaneKind,
    pub connection: ConnectionItem,
    pub inbounds: Vec<InboundItem>,
    /// A zone proxy's `networking.listeners` (not probed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<Listener>,
}

fn sidecar() -> DataplaneKind {
    DataplaneKind::Sidecar
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionItem {
    pub connected: bool,
    pub connected_at: Option<Timestamp>,
    pub last_report_at: Option<Timestamp>,
    /// The other instance (sharing the PostgreSQL store) holding this
    /// dataplane's stream; absent when it is held here or nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// The Envoy's version, as its node reported it; absent when it
    /// reported none, or no Envoy connected to this instance yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_version: Option<String>,
    /// What is wrong with the Envoy's streams, if anything (e.g.
    /// `specifier_rejected`: it ends the stream after every specifier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<ReasonItem>,
}

/// A reason: a stable code for programs and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonItem {
    pub code: String,
    pub message: String,
}

impl From<crate::capability::Reason> for ReasonItem {
    fn from(r: crate::capability::Reason) -> Self {
        ReasonItem {
            code: r.code.to_string(),
            message: r.message,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundItem {
    /// Kuma's inbound `name`, when the file gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub port: u16,
    pub service_port: u16,
    pub service_address: IpAddr,
    pub tags: BTreeMap<String, String>,
    /// The declared `state`: `Ready`, `NotReady` (never ready) or `Ignored`
    /// (not probed, shown as `ignored`, never holds the dataplane back).
    #[serde(default)]
    pub state: InboundState,
    pub health: HealthItem,
    /// How Envoy probes this inbound; absent when nobody probes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeItem>,
}

/// The probe target of an inbound (in the specifier) and its effective settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeItem {
    /// `tcp`, `http` or `grpc`: the check as configured.
    #[serde(default)]
    pub kind: String,
    /// The check the Envoy runs instead, when its version cannot run
    /// `kind` and `hds.check.fallback` names one (`tcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The specifier's cluster name for the target.
    pub cluster: String,
    /// `serviceAddress:servicePort`, what Envoy connects to.
    pub target: std::net::SocketAddr,
    #[serde(with = "humantime_serde")]
    pub interval: std::time::Duration,
    #[serde(with = "humantime_serde")]
    pub timeout: std::time::Duration,
    #[serde(with = "humantime_serde")]
    pub no_traffic_interval: std::time::Duration,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthItem {
    pub ready: bool,
    pub status: String,
    pub since: Timestamp,
    pub last_report_at: Option<Timestamp>,
    /// This inbound's recent status changes, oldest first (a few, since hdsd started).
    #[serde(default)]
    pub changes: Vec<StatusChangeItem>,
    /// Why it is not ready, or what to know about how it is checked
    /// (`envoy_too_old` with status `unsupported`; `probe_fallback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ReasonItem>,
}

/// One status change of an inbound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusChangeItem {
    pub from: String,
    pub to: String,
    pub at: Timestamp,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct List<T> {
    pub items: Vec<T>,
}

impl DataplaneItem {
    /// The API view of a dataplane's state; `None` for a deleted one.
    pub fn from_state(state: &DataplaneState) -> Option<DataplaneItem> {
        let defined = state.defined.as_ref()?;
        let dp = &defined.dataplane;
        Some(DataplaneItem {
            mesh: dp.id.mesh.clone(),
            name: dp.id.name.clone(),
            address: dp.address,
            kind: dp.kind(),
            listeners: dp.listeners.clone(),
            connection: ConnectionItem {
                // The fleet's answer: connected while any instance holds
                // the stream (here, or the holder another one announced).
                connected: state.connection.stream.is_some() || state.connection.holder.is_some(),
                connected_at: state.connection.connected_at,
                last_report_at: state.health.last_report_at,
                held_by: state
                    .connection
                    .holder
                    .clone()
                    .filter(|_| state.connection.stream.is_none()),
                envoy_version: state.envoy.version.map(|v| v.to_string()),
                problem: state.envoy.problem().map(Into::into),
            },
            inbounds: dp
                .inbounds
                .iter()
                .zip(&state.health.inbounds)
                .enumerate()
                .map(|(i, (inbound, health))| InboundItem {
                    name: inbound.name.clone(),
                    port: inbound.port,
                    service_port: inbound.service_port,
                    service_address: inbound.service_address,
                    tags: inbound.tags.clone(),
                    state: inbound.state,
                    health: HealthItem {
                        ready: match inbound.state {
                            InboundState::Ready => health.status.is_ready(),
                            InboundState::NotReady => false,
                            InboundState::Ignored => true,
                        },
                        status: match inbound.state {
                            InboundState::Ignored => "ignored".to_string(),
                            _ => health.status.as_str().to_string(),
                        },
                        since: health.since,
                        last_report_at: health.last_report_at,
                        changes: state
                            .health
                            .recent
                            .iter()
                            .filter(|c| c.inbound == i)
                            .map(|c| StatusChangeItem {
                                from: c.from.as_str().to_string(),
                                to: c.to.as_str().to_string(),
                                at: c.at,
                            })
                            .collect(),
                        reason: state.reason_of_inbound(i).map(Into::into),
                    },
                    probe: defined
                        .specifier
                        .target_of_inbound
                        .get(i)
                        .copied()
                        .flatten()
                        .and_then(|t| defined.specifier.targets.get(t))
                        .map(|t| ProbeItem {
                            kind: t.check.kind().to_string(),
                            fallback: state
                                .reason_of_inbound(i)
                                .filter(|r| r.code == "probe_fallback")
                                .map(|_| "tcp".to_string()),
                            cluster: t.cluster.clone(),
                            target: t.endpoint,
                            interval: t.settings.interval,
                            timeout: t.settings.timeout,
                            no_traffic_interval: t.settings.no_traffic_interval,
                            healthy_threshold: t.settings.healthy_threshold,
                            unhealthy_threshold: t.settings.unhealthy_threshold,
                        }),
                })
                .collect(),
        })
    }

    pub fn is_ready(&self) -> bool {
        self.inbounds.iter().all(|i| i.health.ready)
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    mesh: Option<String>,
    ready: Option<bool>,
}

async fn list_dataplanes(
    State(s): State<ApiState>,
    Query(q): Query<ListQuery>,
) -> Json<List<DataplaneItem>> {
    // The catalog is a BTreeMap keyed by (mesh, name): already sorted.
    let items = s
        .registry
        .catalog()
        .iter()
        .filter(|(id, _)| q.mesh.as_ref().is_none_or(|m| &id.mesh == m))
        .filter_map(|(_, h)| DataplaneItem::from_state(&h.state()))
        .filter(|item| q.ready.is_none_or(|r| item.is_ready() == r))
        .collect();
    Json(List { items })
}

async fn get_dataplane(
    State(s): State<ApiState>,
    Path((mesh, name)): Path<(String, String)>,
) -> Response {
    let id = DataplaneId::new(mesh, name);
    match s
        .registry
        .get(&id)
        .and_then(|h| DataplaneItem::from_state(&h.state()))
    {
        Some(item) => match definitions::revision_of(&s, &id).await {
            // The stored revision, for If-Match on the next write.
            Some(revision) => (
                [(axum::http::header::ETAG, definitions::etag(revision))],
                Json(item),
            )
                .into_response(),
            None => Json(item).into_response(),
        },
        None => error(
            StatusCode::NOT_FOUND,
            &format!("dataplane {id} not found; GET /api/v1/dataplanes lists the known ones"),
        ),
    }
}

#[derive(Debug, Deserialize)]
struct ServicesQuery {
    mesh: Option<String>,
}

/// Per-service health by Kuma's rules (online, partially_degraded, offline).
async fn list_services(
    State(s): State<ApiState>,
    Query(q): Query<ServicesQuery>,
) -> Json<List<crate::consumers::services::ServiceItem>> {
    let items: Vec<DataplaneItem> = s
        .registry
        .catalog()
        .values()
        .filter_map(|h| DataplaneItem::from_state(&h.state()))
        .collect();
    Json(List {
        items: crate::consumers::services::services(&items, q.mesh.as_deref()),
    })
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourcesView {
    pub dir: String,
    pub files: Vec<SourceFile>,
    /// Files failing now.
    pub errors: usize,
    /// Documents of other resource types skipped, over all files.
    #[serde(default)]
    pub ignored: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceFile {
    pub path: String,
    /// The dataplanes in force from this file (its last good ones when broken).
    pub dataplanes: Vec<String>,
    /// Documents that are not Dataplanes (`Mesh`, policies...): skipped.
    #[serde(default)]
    pub ignored: Vec<IgnoredDocument>,
    pub error: Option<FileErrorItem>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FileErrorItem {
    pub line: Option<usize>,
    pub message: String,
}

impl From<&FileError> for FileErrorItem {
    fn from(e: &FileError) -> Self {
        FileErrorItem {
            line: e.line,
            message: e.message.clone(),
        }
    }
}

async fn sources(State(s): State<ApiState>) -> Json<SourcesView> {
    let loaded = s.sources.borrow().clone();
    Json(SourcesView {
        dir: loaded.dir.display().to_string(),
        errors: loaded.error_count(),
        ignored: loaded.ignored_by_type().values().sum(),
        files: loaded
            .files
            .iter()
            .map(|(path, f)| SourceFile {
                path: path.display().to_string(),
                dataplanes: f
                    .dataplanes
                    .iter()
                    .map(|d| d.dataplane.id.to_string())
                    .collect(),
                ignored: f.ignored.clone(),
                error: f.error.as_ref().map(FileErrorItem::from),
            })
            .collect(),
    })
}

async fn readyz(State(s): State<ApiState>) -> Response {
    if !s.ready.load(Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: starting\n").into_response();
    }
    let mut body = String::from("ready\n");
    for note in s.notes.iter() {
        body.push_str(note);
        body.push('\n');
    }
    // Still ready while the store is unreachable: this instance serves.
    if let Some(status) = &s.store_status {
        body.push_str(&status.readyz_line(chrono::Utc::now()));
        body.push('\n');
    }
    body.into_response()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BootstrapQuery {
    /// hdsd's HDS address as the Envoy will reach it; default: this request's host and the HDS port.
    server: Option<String>,
    admin_port: Option<u16>,
    /// Path of the CA file on the Envoy's machine (turns TLS on).
    ca: Option<std::path::PathBuf>,
}

/// The Envoy bootstrap for the identity in the caller's dataplane token.
async fn bootstrap(
    State(s): State<ApiState>,
    headers: axum::http::HeaderMap,
    Query(q): Query<BootstrapQuery>,
) -> Response {
    let Some(gate) = &s.gate else {
        return error(
            StatusCode::BAD_REQUEST,
            "bootstraps by token need auth.mode = \"token\"; without tokens use `hdsd bootstrap --mesh M --name N`",
        );
    };
    let token = match bearer_token(&headers) {
        Ok(token) => token,
        Err(e) => {
            return error(
                StatusCode::UNAUTHORIZED,
                &format!("{e}; send the dataplane token as `Authorization: Bearer <token>` (issue one with `hdsd token issue`)"),
            )
        }
    };
    let claims = match gate.verify(token, chrono::Utc::now()) {
        Ok(c) => c,
        Err(r) => {
            metrics::counter!(crate::metrics::AUTH_FAILURES, "reason" => r.reason()).increment(1);
            tracing::warn!(reason = r.reason(), "bootstrap refused: {}", r.detail());
            return error(StatusCode::UNAUTHORIZED, &r.to_string());
        }
    };
    let server = q.server.unwrap_or_else(|| {
        let host = headers
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
            .map(|a| a.host().to_string())
            .unwrap_or_else(|| "127.0.0.1".to_string());
        format!("{host}:{}", s.hds_port)
    });
    let params = crate::bootstrap::BootstrapParams {
        id: DataplaneId::new(claims.mesh, claims.name),
        servers: vec![server],
        token: Some(token.to_string()),
        admin_port: q.admin_port.unwrap_or(9901),
        ca: q.ca,
    };
    match crate::bootstrap::bootstrap_yaml(&params) {
        Ok(yaml) => (
            [(axum::http::header::CONTENT_TYPE, "application/yaml")],
            yaml,
        )
            .into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn metrics(State(s): State<ApiState>) -> Response {
    match s.metrics {
        Some(scrape) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            scrape.render(),
        )
            .into_response(),
        None => error(StatusCode::NOT_FOUND, "metrics are not enabled"),
    }
}

/// `/api/*` needs `Authorization: Bearer <one of api.tokens>` when tokens are configured.
async fn require_token(
    State(s): State<ApiState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if s.tokens.is_empty() {
        return next.run(request).await;
    }
    match bearer_token(request.headers()) {
        // Constant-time per token, so timing does not reveal a token's prefix.
        Ok(t) if is_api_token(&s.tokens, t) => next.run(request).await,
        Ok(_) => error(
            StatusCode::UNAUTHORIZED,
            "invalid API token; use one of api.tokens",
        ),
        Err(BearerError::Missing) => error(
            StatusCode::UNAUTHORIZED,
            "this API needs a token: send `Authorization: Bearer <token>` with one of api.tokens",
        ),
        Err(e) => error(
            StatusCode::UNAUTHORIZED,
            &format!("{e}; this API needs `Authorization: Bearer <token>` with one of api.tokens"),
        ),
    }
}

/// Whether `presented` is one of `api.tokens`, compared in constant time per
/// token so that timing does not reveal a token's prefix. Used by REST and gRPC.
pub(crate) fn is_api_token(tokens: &[String], presented: &str) -> bool {
    tokens
        .iter()
        .any(|known| bool::from(known.as_bytes().ct_eq(presented.as_bytes())))
}

/// The token of the `Authorization` header, by the rule of [`bearer::parse`].
fn bearer_token(headers: &axum::http::HeaderMap) -> Result<&str, BearerError> {
    match headers.get(axum::http::header::AUTHORIZATION) {
        None => Err(BearerError::Missing),
        Some(value) => value
            .to_str()
            .map_err(|_| BearerError::NotAscii)
            .and_then(bearer::parse),
    }
}

fn error(code: StatusCode, message: &str) -> Response {
    (code, Json(serde_json::json!({ "error": message }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::parse_documents;
    use crate::readiness::rebase;
    use crate::registry::Connection;
    use crate::source::Defined;
    use crate::specifier::{build, endpoint, SpecifierSettings};
    use chrono::TimeZone;
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;
    use envoy_types::pb::envoy::service::health::v3::{
        ClusterEndpointsHealth, EndpointHealth, EndpointHealthResponse, LocalityEndpointsHealth,
    };

    fn report(status: HealthStatus) -> EndpointHealthResponse {
        EndpointHealthResponse {
            cluster_endpoints_health: vec![ClusterEndpointsHealth {
                cluster_name: "probe_127.0.0.1:8080".into(),
                locality_endpoints_health: vec![LocalityEndpointsHealth {
                    locality: None,
                    endpoints_health: vec![EndpointHealth {
                        endpoint: Some(endpoint(([127, 0, 0, 1], 8080).into())),
                        health_status: status as i32,
                        health_metadata: None,
                    }],
                }],
            }],
            ..Default::default()
        }
    }

    /// The item carries each inbound's probe target and settings and its
    /// recent status changes; an inbound nobody probes has no probe.
    #[test]
    fn items_show_probe_settings_and_recent_changes() {
        let text = "type: Dataplane\nmesh: default\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    serviceProbe:\n      interval: 2s\n      unhealthyThreshold: 3\n  - port: 10002\n    servicePort: 9090\n";
        let dp = parse_documents(text).unwrap().remove(0);
        let settings = SpecifierSettings {
            probe_all_inbounds: false,
            ..SpecifierSettings::default()
        };
        let specifier = build(&dp, &settings).unwrap();
        let t = |s: i64| chrono::Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        let mut health = rebase(None, &dp, &specifier, t(0));
        crate::readiness::fold_report(
            &mut health,
            &specifier,
            &report(HealthStatus::Healthy).into(),
            t(1),
        );
        crate::readiness::fold_report(
            &mut health,
            &specifier,
            &report(HealthStatus::Unhealthy).into(),
            t(2),
        );
        let state = DataplaneState {
            defined: Some(Defined {
                dataplane: Arc::new(dp),
                specifier: Arc::new(specifier),
                file: "web-01.yaml".into(),
            }),
            version: 1,
            health,
            connection: Connection::default(),
            envoy: Default::default(),
        };
        let item = DataplaneItem::from_state(&state).unwrap();
        let json = serde_json::to_value(&item).unwrap();
        let probed = &json["inbounds"][0];
        assert_eq!(
            probed["probe"],
            serde_json::json!({
                "kind": "tcp",
                "cluster": "probe_127.0.0.1:8080",
                "target": "127.0.0.1:8080",
                "interval": "2s",
                "timeout": "1s",
                "noTrafficInterval": "2s",
                "healthyThreshold": 1,
                "unhealthyThreshold": 3,
            })
        );
        let changes: Vec<(&str, &str)> = item.inbounds[0]
            .health
            .changes
            .iter()
            .map(|c| (c.from.as_str(), c.to.as_str()))
            .collect();
        assert_eq!(changes, [("pending", "healthy"), ("healthy", "unhealthy")]);
        assert_eq!(item.inbounds[0].health.changes[1].at, t(2));
        // Not probed: no probe field, no changes.
        assert!(json["inbounds"][1].get("probe").is_none());
        assert_eq!(
            json["inbounds"][1]["health"]["changes"],
            serde_json::json!([])
        );
        // Additive: an item without the new fields (an older hdsd) still reads.
        let mut old = json.clone();
        old["inbounds"][0].as_object_mut().unwrap().remove("probe");
        old["inbounds"][0]["health"]
            .as_object_mut()
            .unwrap()
            .remove("changes");
        let read: DataplaneItem = serde_json::from_value(old).unwrap();
        assert!(read.inbounds[0].probe.is_none() && read.inbounds[0].health.changes.is_empty());
    }

    /// Any instance answers for the fleet: a stream held by another
    /// instance reads connected, naming the holder.
    #[test]
    fn a_stream_held_elsewhere_reads_connected_with_its_holder() {
        let t = |s: i64| chrono::Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        let dp = crate::dataplane::parse_documents(
            "type: Dataplane\nmesh: default\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web}\n",
        )
        .unwrap()
        .remove(0);
        let specifier = build(&dp, &SpecifierSettings::default()).unwrap();
        let mut state = DataplaneState {
            health: crate::readiness::rebase(None, &dp, &specifier, t(0)),
            defined: Some(Defined {
                dataplane: Arc::new(dp),
                specifier: Arc::new(specifier),
                file: "web-01.yaml".into(),
            }),
            version: 1,
            connection: Connection::default(),
            envoy: Default::default(),
        };
        let item = DataplaneItem::from_state(&state).unwrap();
        assert!(!item.connection.connected);
        state.connection.holder = Some("b".into());
        let item = DataplaneItem::from_state(&state).unwrap();
        assert!(item.connection.connected);
        assert_eq!(item.connection.held_by.as_deref(), Some("b"));
        // Held here (a stream of ours): no holder shown.
        state.connection.stream = Some(1);
        let item = DataplaneItem::from_state(&state).unwrap();
        assert!(item.connection.connected);
        assert_eq!(item.connection.held_by, None);
    }
}
