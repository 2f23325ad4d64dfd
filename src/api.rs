//! The REST API (axum): dataplanes and their readiness, sources, health.
//! Every request passes [`browsers`] first (a page of another site writes
//! nothing, a rebound DNS name reaches no open API).
//!
//! Handlers only read snapshots: the catalog, each dataplane's watch value,
//! and the source snapshot. They never write state; the write calls of
//! [`definitions`] write to the store, whose changes reach the registry like
//! file changes, and a global's zone writes go through
//! [`ZoneAdmin`](crate::zone_sync::admin::ZoneAdmin) (the cluster, then the
//! hub, its one writer).

mod browsers;
pub mod definitions;
mod history;
mod zones;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use crate::view::{
    ConnectionItem, DataplaneItem, HealthItem, InboundItem, List, Paged, ProbeItem, ReasonItem,
    StatusChangeItem,
};
pub use browsers::Browsers;

use crate::consumers::paging;

use crate::auth::{bearer, BearerError};
use crate::dataplane::{DataplaneId, IgnoredDocument, Warning};
use crate::registry::Registry;
use crate::source::{FileError, Loaded};

/// What the API's handlers need, in parts: each handler takes only the
/// part it reads (axum's `FromRef` substates).
#[derive(Debug, Clone)]
pub struct ApiState {
    pub fleet: Fleet,
    pub health: Health,
    pub tokens: ApiTokens,
    pub bootstraps: Bootstraps,
    /// Renders `/metrics`; absent when metrics are off (tests of the router alone).
    pub metrics: Metrics,
    /// The change feed, for `/api/v1/watch`.
    pub feed: crate::feed::FeedHandle,
    /// The watches open (SSE and gRPC share them), within `api.limits`.
    pub watches: crate::consumers::watch::Watches,
    /// Where definitions come from: the write calls answer 409 for files.
    pub definitions: definitions::Definitions,
    /// What a global holds of its zones, and a zone's link to its global.
    pub zones: Zones,
    /// The last hour of the fleet (`/api/v1/history`).
    pub history: crate::history::HistoryHandle,
    /// The summary's and the services' counts, kept as the fleet changes.
    pub counts: crate::consumers::counts::CountsHandle,
    /// What keeps a browser from writing for another site ([`browsers`]).
    pub browsers: Browsers,
}

/// Zones as this instance sees them: as a global (every zone it holds), as
/// a zone (its link to the global), or neither.
#[derive(Debug, Clone, Default)]
pub struct Zones {
    pub hub: Option<crate::zone_sync::global::HubHandle>,
    pub uplink: Option<crate::zone_sync::uplink::UplinkHandle>,
    /// On a global: zones registered, disabled and deleted through the API.
    pub admin: Option<Arc<crate::zone_sync::admin::ZoneAdmin>>,
}

/// What the read handlers read: the registry's dataplanes and the sources.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub registry: Registry,
    pub sources: watch::Receiver<Arc<Loaded>>,
}

/// What `/readyz` says.
#[derive(Debug, Clone)]
pub struct Health {
    /// Set once both listeners are bound and the dataplanes are loaded.
    pub ready: Arc<AtomicBool>,
    /// Extra lines for `/readyz`'s body (e.g. warnings about the setup).
    pub notes: Arc<Vec<String>>,
    /// Whether the shared store answers; `None` without one.
    pub store_status: Option<crate::store::StoreStatus>,
    /// A zone's link to its global; `None` unless `[zone]` is set.
    pub uplink: Option<crate::zone_sync::uplink::UplinkHandle>,
}

/// Bearer tokens that `/api/*` requires; empty means open (loopback only).
#[derive(Debug, Clone, Default)]
pub struct ApiTokens(pub Arc<Vec<String>>);

/// What `/api/v1/bootstrap` needs.
#[derive(Debug, Clone)]
pub struct Bootstraps {
    /// Verifies dataplane tokens; `None` without token auth.
    pub gate: Option<Arc<crate::auth::Gate>>,
    /// The HDS listener's port, the default for bootstraps.
    pub hds_port: u16,
}

/// Renders `/metrics`, when metrics are on.
#[derive(Debug, Clone, Default)]
pub struct Metrics(pub Option<crate::scrape::Scrape>);

macro_rules! substate {
    ($($part:ident: $ty:ty),* $(,)?) => {
        $(impl axum::extract::FromRef<ApiState> for $ty {
            fn from_ref(s: &ApiState) -> Self {
                s.$part.clone()
            }
        })*
    };
}

substate!(
    fleet: Fleet,
    health: Health,
    tokens: ApiTokens,
    bootstraps: Bootstraps,
    metrics: Metrics,
    feed: crate::feed::FeedHandle,
    watches: crate::consumers::watch::Watches,
    definitions: definitions::Definitions,
    zones: Zones,
    history: crate::history::HistoryHandle,
    counts: crate::consumers::counts::CountsHandle,
    browsers: Browsers,
);

impl axum::extract::FromRef<ApiState> for crate::ui::PageSettings {
    fn from_ref(s: &ApiState) -> Self {
        crate::ui::PageSettings {
            token_required: !s.tokens.0.is_empty(),
        }
    }
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
        .route(
            "/api/v1/dataplanes/{mesh}/{name}/history",
            get(history::local),
        )
        .route("/api/v1/history", get(history::fleet))
        .route("/api/v1/sources", get(sources))
        .route("/api/v1/zones", get(zones::list))
        .route(
            "/api/v1/zones/{zone}",
            get(zones::get).put(zones::put).delete(zones::delete),
        )
        .route(
            "/api/v1/zones/{zone}/disable",
            axum::routing::post(zones::disable),
        )
        .route(
            "/api/v1/zones/{zone}/enable",
            axum::routing::post(zones::enable),
        )
        .route(
            "/api/v1/zones/{zone}/dataplanes/{mesh}/{name}",
            get(zones::get_dataplane),
        )
        .route(
            "/api/v1/zones/{zone}/dataplanes/{mesh}/{name}/history",
            get(history::remote),
        )
        .route("/api/v1/services", get(list_services))
        .route("/api/v1/fleet/summary", get(fleet_summary))
        .route("/api/v1/watch", get(crate::consumers::sse::handler))
        .route_layer(axum::middleware::from_fn_with_state(
            state.tokens.clone(),
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
                "no such endpoint; see the REST API reference in docs/api.md",
            )
        })
        // Before any route, the token check included: a browser's request
        // for a page of another site writes nothing.
        .layer(axum::middleware::from_fn_with_state(
            state.browsers.clone(),
            browsers::guard,
        ))
        .with_state(state)
}

/// The parameters of `GET /api/v1/dataplanes` and `/api/v1/fleet/summary`,
/// as text: [`paging`] checks them and says what is allowed.
#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    mesh: Option<String>,
    /// Only dataplanes with an inbound of this `kuma.io/service`.
    service: Option<String>,
    /// `true` or `false`.
    ready: Option<String>,
    /// Only dataplanes with an inbound in one of these statuses (commas).
    status: Option<String>,
    /// On a global: only this zone's dataplanes (`local`: only the global's own).
    zone: Option<String>,
    page_size: Option<String>,
    page_token: Option<String>,
}

impl ListQuery {
    fn query(&self) -> Result<paging::Query, paging::QueryError> {
        paging::Query::from_params(
            self.mesh.as_deref(),
            self.service.as_deref(),
            self.zone.as_deref(),
            self.ready.as_deref(),
            self.status.as_deref(),
        )
    }
}

/// The parameters, or a 400 that says what is wrong with them.
fn list_query(q: Result<Query<ListQuery>, QueryRejection>) -> Result<ListQuery, Box<Response>> {
    match q {
        Ok(Query(q)) => Ok(q),
        Err(e) => Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("{}; the parameters are mesh, service, zone, ready (true or false), status (inbound status words, commas between), page_size (1 to {}, default {}) and page_token", e.body_text(), paging::MAX_PAGE_SIZE, paging::DEFAULT_PAGE_SIZE),
        ))),
    }
}

/// One page of this instance's dataplanes, then (on a global) every
/// zone's, zone by zone (Google AIP-158: `page_size`, `page_token`,
/// `nextPageToken`). With a next page, a `Link: <...>; rel="next"` header
/// names it too.
async fn list_dataplanes(
    State(s): State<Fleet>,
    State(z): State<Zones>,
    uri: axum::http::Uri,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let q = match list_query(q) {
        Ok(q) => q,
        Err(response) => return *response,
    };
    let answer = q.query().and_then(|query| {
        let size = paging::page_size_param(q.page_size.as_deref())?;
        let request = paging::PageRequest::new(size, q.page_token.as_deref(), &query)?;
        Ok((query, request))
    });
    let (query, request) = match answer {
        Ok(parts) => parts,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let catalog = s.registry.catalog();
    let view = z.hub.as_ref().map(|hub| hub.view());
    let page = paging::fleet_page(&catalog, view.as_deref(), &query, &request);
    let next_page_token = page.next_token(&query);
    let body = Json(Paged {
        items: page.items.into_iter().map(|(_, item)| item).collect(),
        next_page_token: next_page_token.clone(),
    });
    match next_page_token {
        Some(token) => {
            let link = format!("<{}>; rel=\"next\"", next_link(&uri, &token));
            ([(axum::http::header::LINK, link)], body).into_response()
        }
        None => body.into_response(),
    }
}

/// The request's own path and parameters, with `page_token` replaced.
fn next_link(uri: &axum::http::Uri, token: &str) -> String {
    let mut params: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("page_token="))
        .collect();
    let token = format!("page_token={token}");
    params.push(&token);
    format!("{}?{}", uri.path(), params.join("&"))
}

/// The counts of the dataplanes the same filters take in (every page of
/// them): dataplanes ready, not ready, connected and by class, inbounds by
/// status, and each service's inbounds ready of total. From the kept
/// counts when they cover the filters, else by a walk over the fleet.
async fn fleet_summary(
    State(s): State<Fleet>,
    State(z): State<Zones>,
    State(counts): State<crate::consumers::counts::CountsHandle>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let q = match list_query(q) {
        Ok(q) => q,
        Err(response) => return *response,
    };
    if q.page_size.is_some() || q.page_token.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "the summary counts every dataplane the filters take in and has no pages: leave page_size and page_token out",
        );
    }
    let query = match q.query() {
        Ok(query) => query,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if let Some(summary) = counts.summary(&query).await {
        return Json(summary).into_response();
    }
    let catalog = s.registry.catalog();
    let view = z.hub.as_ref().map(|hub| hub.view());
    Json(paging::fleet_summary(&catalog, view.as_deref(), &query)).into_response()
}

async fn get_dataplane(
    State(s): State<Fleet>,
    State(defined): State<definitions::Definitions>,
    Path((mesh, name)): Path<(String, String)>,
) -> Response {
    let id = DataplaneId::new(mesh, name);
    match s
        .registry
        .get(&id)
        .and_then(|h| DataplaneItem::from_state(&h.state()))
    {
        Some(item) => match definitions::revision_of(&defined, &id).await {
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

/// Per-service health by Kuma's rules (online, partially_degraded, offline);
/// on a global, over every zone and per zone. From the kept counts, or
/// (when they are behind) by a walk over the fleet.
async fn list_services(
    State(s): State<Fleet>,
    State(z): State<Zones>,
    State(counts): State<crate::consumers::counts::CountsHandle>,
    Query(q): Query<ServicesQuery>,
) -> Json<List<crate::consumers::services::ServiceItem>> {
    let mesh = q.mesh.as_deref();
    let items = match counts.services(mesh).await {
        Some(items) => items,
        None => {
            let view = z.hub.as_ref().map(|hub| hub.view());
            paging::fleet_services(&s.registry.catalog(), view.as_deref(), mesh)
        }
    };
    Json(List { items })
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
    /// Warnings, over all files.
    #[serde(default)]
    pub warnings: usize,
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
    /// What does not stop the file from loading: fields ignored
    /// (`dataplanes.unknown_fields = "warn"`), inbounds in no service.
    #[serde(default)]
    pub warnings: Vec<Warning>,
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

async fn sources(State(s): State<Fleet>) -> Json<SourcesView> {
    let loaded = s.sources.borrow().clone();
    Json(SourcesView {
        dir: loaded.dir.display().to_string(),
        errors: loaded.error_count(),
        ignored: loaded.ignored_by_type().values().sum(),
        warnings: loaded.files.values().map(|f| f.warnings.len()).sum(),
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
                warnings: f.warnings.clone(),
                error: f.error.as_ref().map(FileErrorItem::from),
            })
            .collect(),
    })
}

async fn readyz(State(s): State<Health>) -> Response {
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
    // Still ready while the global is unreachable: the zone serves its Envoys.
    if let Some(uplink) = &s.uplink {
        body.push_str(&uplink.status().readyz_line());
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
    State(s): State<Bootstraps>,
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

async fn metrics(State(Metrics(scrape)): State<Metrics>) -> Response {
    match scrape {
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
    State(ApiTokens(tokens)): State<ApiTokens>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if tokens.is_empty() {
        return next.run(request).await;
    }
    match bearer_token(request.headers()) {
        // Constant-time per token, so timing does not reveal a token's prefix.
        Ok(t) if bearer::is_api_token(&tokens, t) => next.run(request).await,
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
