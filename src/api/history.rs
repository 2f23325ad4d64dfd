//! The last hour: `GET /api/v1/history` (the fleet's timeline and, on a
//! global, the zones' state changes) and one dataplane's status changes
//! (`.../dataplanes/{mesh}/{name}/history`, a zone's on a global under
//! `/api/v1/zones/{zone}/`), read from the history's task
//! ([`crate::history`]).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error;
use crate::dataplane::DataplaneId;
use crate::feed::Key;
use crate::history::HistoryHandle;

const STOPPING: &str = "the history has stopped: hdsd is shutting down; retry on another instance";

pub async fn fleet(State(history): State<HistoryHandle>) -> Response {
    match history.fleet().await {
        Ok(h) => Json(h).into_response(),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, STOPPING),
    }
}

pub async fn local(
    State(history): State<HistoryHandle>,
    Path((mesh, name)): Path<(String, String)>,
) -> Response {
    let id = DataplaneId::new(mesh, name);
    one(&history, Key::Local(id.clone()), || {
        format!("dataplane {id} has no history here: it is not known, or was deleted more than the history's span ago; GET /api/v1/dataplanes lists the known ones")
    })
    .await
}

pub async fn remote(
    State(history): State<HistoryHandle>,
    Path((zone, mesh, name)): Path<(String, String, String)>,
) -> Response {
    let id = DataplaneId::new(mesh, name);
    let key = Key::Remote(Arc::from(zone.as_str()), id.clone());
    one(&history, key, || {
        format!("dataplane {id} of zone {zone:?} has no history here: the global does not hold it, or it left more than the history's span ago; GET /api/v1/dataplanes?zone={zone} lists them")
    })
    .await
}

async fn one(history: &HistoryHandle, key: Key, missing: impl FnOnce() -> String) -> Response {
    match history.of(key).await {
        Ok(Some(h)) => Json(h).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, &missing()),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, STOPPING),
    }
}
