//! `PUT` and `DELETE /api/v1/dataplanes/{mesh}/{name}`: definitions managed
//! through the API (`dataplanes.source = "api"`). A handler validates the
//! document and writes it to the store; it never touches the registry: the
//! store's change reaches the registry through the definitions watcher, the
//! same path as a file change (one writer of the catalog).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error;
use crate::dataplane::DataplaneId;
pub use crate::sources::Definitions;
use crate::sources::{check_document, Rules};
use crate::store::definitions::{DefinitionStore, DocumentFormat, Precondition, WriteError};

/// The `ETag` of a revision.
pub fn etag(revision: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{revision}\"")).expect("digits and quotes")
}

/// The precondition of `If-Match` / `If-None-Match`, or why it is unusable.
pub fn precondition(headers: &HeaderMap) -> Result<Precondition, String> {
    let text = |name: header::HeaderName| {
        headers
            .get(&name)
            .map(|v| {
                v.to_str()
                    .map(str::trim)
                    .map_err(|_| format!("{name} is not ASCII"))
            })
            .transpose()
    };
    match (text(header::IF_MATCH)?, text(header::IF_NONE_MATCH)?) {
        (Some(_), Some(_)) => Err("send If-Match or If-None-Match, not both".to_string()),
        (None, Some("*")) => Ok(Precondition::Absent),
        (None, Some(other)) => Err(format!(
            "If-None-Match: {other} is not supported; use If-None-Match: * to create only"
        )),
        (Some("*"), None) => Ok(Precondition::Present),
        (Some(tag), None) => tag
            .strip_prefix("W/")
            .unwrap_or(tag)
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .and_then(|t| t.parse().ok())
            .map(Precondition::Revision)
            .ok_or_else(|| {
                format!(
                    "If-Match: {tag} is not an ETag of this API (a quoted revision, e.g. \"42\")"
                )
            }),
        (None, None) => Ok(Precondition::Any),
    }
}

fn format_of(headers: &HeaderMap) -> DocumentFormat {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.to_ascii_lowercase().contains("json"));
    if json {
        DocumentFormat::Json
    } else {
        DocumentFormat::Yaml
    }
}

/// The store, or the 409 that says where definitions come from.
fn store_of(defined: &Definitions) -> Result<(&Arc<dyn DefinitionStore>, &Rules), Box<Response>> {
    match defined {
        Definitions::Store { store, rules } => Ok((store, rules)),
        Definitions::Dir(dir) => Err(Box::new(error(
            StatusCode::CONFLICT,
            &format!(
                "dataplanes.source is \"dir\": definitions come from the files in {}; edit them there, or set dataplanes.source = \"api\" to manage definitions through this API",
                dir.display()
            ),
        ))),
    }
}

fn identity(mesh: String, name: String) -> Result<DataplaneId, Box<Response>> {
    DataplaneId::try_new(&mesh, &name).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("{mesh:?}/{name:?} is not a dataplane identity: {e}"),
        ))
    })
}

fn conflict(id: &DataplaneId, current: Option<u64>) -> Response {
    let message = match current {
        Some(r) => format!(
            "precondition failed: dataplane {id} is at revision {r} (ETag \"{r}\"); read it again and retry with If-Match: \"{r}\""
        ),
        None => format!(
            "precondition failed: dataplane {id} is not defined; create it without If-Match (or with If-None-Match: *)"
        ),
    };
    let mut response = error(StatusCode::PRECONDITION_FAILED, &message);
    if let Some(r) = current {
        response.headers_mut().insert(header::ETAG, etag(r));
    }
    response
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("{e}; nothing was written, retry later"),
    )
}

/// `PUT /api/v1/dataplanes/{mesh}/{name}`: creates or replaces a definition.
pub async fn put(
    State(defined): State<Definitions>,
    Path((mesh, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let (store, rules) = match store_of(&defined) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let id = match identity(mesh, name) {
        Ok(id) => id,
        Err(response) => return *response,
    };
    let expect = match precondition(&headers) {
        Ok(p) => p,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let format = format_of(&headers);
    if let Err(rejected) = check_document(&id, format, &body, rules) {
        let message = format!("dataplane {id} rejected: {}", rejected.problems.join("; "));
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(serde_json::json!({ "error": message, "problems": rejected.problems })),
        )
            .into_response();
    }
    match store.put(&id, format, &body, expect).await {
        Ok(stored) => {
            tracing::info!(dataplane = %id, revision = stored.revision, "definition written through the API");
            (
                [(header::ETAG, etag(stored.revision))],
                Json(serde_json::json!({
                    "mesh": id.mesh, "name": id.name, "revision": stored.revision,
                })),
            )
                .into_response()
        }
        Err(WriteError::Conflict { current }) => conflict(&id, current),
        Err(WriteError::Store(e)) => unavailable(e),
    }
}

/// `DELETE /api/v1/dataplanes/{mesh}/{name}`.
pub async fn delete(
    State(defined): State<Definitions>,
    Path((mesh, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let (store, _) = match store_of(&defined) {
        Ok(found) => found,
        Err(response) => return *response,
    };
    let id = match identity(mesh, name) {
        Ok(id) => id,
        Err(response) => return *response,
    };
    let expect = match precondition(&headers) {
        Ok(p) => p,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    match store.delete(&id, expect).await {
        Ok(true) => {
            tracing::info!(dataplane = %id, "definition deleted through the API");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            &format!("dataplane {id} is not defined; GET /api/v1/dataplanes lists the known ones"),
        ),
        Err(WriteError::Conflict { current }) => conflict(&id, current),
        Err(WriteError::Store(e)) => unavailable(e),
    }
}

/// The stored revision of `id` for a `GET`'s `ETag`, when definitions come from the store.
///
/// Readiness is served from memory: a store that does not answer within
/// [`REVISION_WAIT`] (cut off, overloaded) leaves the revision out rather
/// than hold the answer.
pub async fn revision_of(defined: &Definitions, id: &DataplaneId) -> Option<u64> {
    match defined {
        Definitions::Store { store, .. } => tokio::time::timeout(REVISION_WAIT, store.get(id))
            .await
            .ok()?
            .ok()
            .flatten()
            .map(|d| d.revision),
        Definitions::Dir(_) => None,
    }
}

/// How long a read of one dataplane waits for its stored revision.
pub const REVISION_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.clone(), HeaderValue::from_str(v).unwrap()))
            .collect()
    }

    #[test]
    fn preconditions_from_headers() {
        assert_eq!(precondition(&headers(&[])), Ok(Precondition::Any));
        assert_eq!(
            precondition(&headers(&[(header::IF_MATCH, "\"42\"")])),
            Ok(Precondition::Revision(42))
        );
        assert_eq!(
            precondition(&headers(&[(header::IF_MATCH, "W/\"7\"")])),
            Ok(Precondition::Revision(7))
        );
        assert_eq!(
            precondition(&headers(&[(header::IF_MATCH, "*")])),
            Ok(Precondition::Present)
        );
        assert_eq!(
            precondition(&headers(&[(header::IF_NONE_MATCH, "*")])),
            Ok(Precondition::Absent)
        );
        assert!(precondition(&headers(&[(header::IF_MATCH, "42")]))
            .unwrap_err()
            .contains("quoted revision"));
        assert!(precondition(&headers(&[
            (header::IF_MATCH, "\"1\""),
            (header::IF_NONE_MATCH, "*")
        ]))
        .is_err());
    }

    #[test]
    fn json_by_content_type_else_yaml() {
        assert_eq!(
            format_of(&headers(&[(header::CONTENT_TYPE, "application/json")])),
            DocumentFormat::Json
        );
        assert_eq!(
            format_of(&headers(&[(header::CONTENT_TYPE, "application/yaml")])),
            DocumentFormat::Yaml
        );
        assert_eq!(format_of(&headers(&[])), DocumentFormat::Yaml);
    }
}
