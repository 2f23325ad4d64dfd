//! The fleet page: `GET /ui/`, plain HTML, CSS and JavaScript embedded in the
//! binary (no build step, no CDN: it works offline). The page reads the same
//! REST API and `/api/v1/watch` stream as any other client, with the same
//! token; the assets themselves are public (they hold no data).

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// A hash of the body, for `ETag` / `If-None-Match`.
    etag: &'static str,
}

macro_rules! asset {
    ($name:literal, $content_type:literal) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_bytes!($name),
            etag: const_format_etag!(include_bytes!($name)),
        }
    };
}

/// `"<fnv-1a 64 of the body in hex>"`, computed at compile time.
macro_rules! const_format_etag {
    ($bytes:expr) => {{
        const HASH: u64 = fnv1a($bytes);
        const HEX: [u8; 18] = etag_bytes(HASH);
        match std::str::from_utf8(&HEX) {
            Ok(s) => s,
            Err(_) => "\"0\"",
        }
    }};
}

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

const fn etag_bytes(hash: u64) -> [u8; 18] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'"'; 18];
    let mut i = 0;
    while i < 16 {
        out[1 + i] = DIGITS[((hash >> (60 - 4 * i)) & 0xf) as usize];
        i += 1;
    }
    out
}

const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
];

/// Only this origin's scripts, styles and API; no inline code, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// What the page's `config.json` tells it, from the server's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSettings {
    /// `api.tokens` is not empty: the page asks for one first.
    pub token_required: bool,
}

/// The page's routes, merged into the API router (whose state gives the
/// [`PageSettings`]).
pub fn router<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    PageSettings: axum::extract::FromRef<S>,
{
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(index))
        .route("/ui/config.json", get(config))
        .route("/ui/{file}", get(file))
}

async fn index(headers: HeaderMap) -> Response {
    serve(&ASSETS[0], &headers)
}

async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(asset) => serve(asset, &headers),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such file; the page is at /ui/\n",
        )
            .into_response(),
    }
}

/// What the page must know before its first API call: whether to ask for a
/// token (so it asks at once instead of failing a request first).
async fn config(State(s): State<PageSettings>) -> Response {
    let body = serde_json::json!({
        "tokenRequired": s.token_required,
        "version": env!("CARGO_PKG_VERSION"),
    });
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        axum::Json(body),
    )
        .into_response()
}

/// The asset, or 304 when the browser's copy is current. `no-cache`: the
/// browser revalidates each time (cheap: a 304), so a new hdsd's page is
/// never mixed with an old one's script.
fn serve(asset: &Asset, headers: &HeaderMap) -> Response {
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == asset.etag));
    let common = [
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, HeaderValue::from_static(asset.etag)),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        )],
        asset.body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_differ_by_content_and_are_quoted_hex() {
        let tags: Vec<&str> = ASSETS.iter().map(|a| a.etag).collect();
        for t in &tags {
            assert_eq!(t.len(), 18);
            assert!(t.starts_with('"') && t.ends_with('"'));
            assert!(t[1..17].chars().all(|c| c.is_ascii_hexdigit()));
        }
        let mut unique = tags.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), tags.len());
        // FNV-1a's published test vector.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn the_page_loads_only_embedded_same_origin_assets() {
        let html = std::str::from_utf8(ASSETS[0].body).unwrap();
        for asset in &ASSETS[1..] {
            assert!(
                html.contains(&format!("\"/ui/{}\"", asset.name)),
                "index.html links {}",
                asset.name
            );
        }
        // No remote resource, no inline script or style (the CSP forbids them).
        assert!(!html.contains("http://") && !html.contains("https://"));
        assert!(!html.contains("<script>") && !html.contains("style=\""));
        let js = std::str::from_utf8(ASSETS[2].body).unwrap();
        // Tokens travel in a header: the browser's EventSource cannot send one.
        assert!(!js.contains("EventSource("));
        assert!(js.contains("Authorization"));
    }

    #[test]
    fn assets_are_served_with_types_and_revalidation() {
        let none = HeaderMap::new();
        let r = serve(&ASSETS[2], &none);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-cache");
        let mut again = HeaderMap::new();
        again.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static(ASSETS[2].etag),
        );
        assert_eq!(serve(&ASSETS[2], &again).status(), StatusCode::NOT_MODIFIED);
        let mut stale = HeaderMap::new();
        stale.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"x\""));
        assert_eq!(serve(&ASSETS[2], &stale).status(), StatusCode::OK);
    }
}
