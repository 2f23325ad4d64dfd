//! What keeps a web browser from writing through the REST API for a page
//! of another site: a browser sends any page's requests with the user's
//! network reach, so a page from anywhere could POST to a loopback API
//! (a "simple" request needs no preflight), and a page whose DNS name is
//! pointed at this machine (DNS rebinding) is, to the browser, the API's
//! own origin. Three rules, checked before any handler:
//!
//! - A state-changing request (any method but GET, HEAD and OPTIONS) whose
//!   `Origin` is not the API's own (the scheme and the `Host` it was sent
//!   to), or is `null`, is refused (403). Clients that are not browsers
//!   (the CLI, curl, scripts) send no `Origin` and are not affected.
//! - Without `api.tokens` (an open, loopback-only API), a request whose
//!   `Host` is not an IP address, `localhost`, a name under `.localhost`
//!   or one of `api.allowed_hosts` is refused (403): a rebound DNS name
//!   never reaches the open API. `/healthz` and `/readyz` answer whatever
//!   the `Host`.
//! - `POST` and `PUT` need a JSON (or, for a dataplane's definition, YAML)
//!   `Content-Type` (415 otherwise): the types a page may send without a
//!   preflight (`text/plain`, forms) never write. `DELETE` is never a
//!   simple request and carries no body.
//!
//! The rules are one pure function ([`check`]); the middleware only reads
//! the headers and answers.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::Response;

use crate::names::shown;

/// What the rules need of the configuration.
#[derive(Debug, Clone, Default)]
pub struct Browsers {
    /// The API has no `api.tokens`: only known `Host` names are answered.
    pub open: bool,
    /// `api.allowed_hosts`, lowercase.
    pub allowed_hosts: Arc<Vec<String>>,
}

impl Browsers {
    /// The rules for an API with these `api.tokens` and `api.allowed_hosts`.
    pub fn new(tokens: &[String], allowed_hosts: &[String]) -> Browsers {
        Browsers {
            open: tokens.is_empty(),
            allowed_hosts: Arc::new(
                allowed_hosts
                    .iter()
                    .map(|h| h.to_ascii_lowercase())
                    .collect(),
            ),
        }
    }
}

/// Why a request was refused, as the client reads it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A `Host` the open API does not answer to.
    #[error("Host {} is not a name this API answers to: without api.tokens, hdsd answers requests for IP addresses, localhost and names under .localhost only (a web page's DNS name pointed at this machine must not reach the open API); add the name to api.allowed_hosts, or set api.tokens", shown(.0))]
    Host(String),
    /// A write from a page of another origin.
    #[error("a cross-origin write is refused: Origin {} is not this API's own ({}); the API takes writes from its own origin and from clients that send no Origin (the CLI, curl)", shown(.origin), shown(.host))]
    Origin {
        /// The `Origin` sent.
        origin: String,
        /// The `Host` the request was sent to.
        host: String,
    },
    /// A write without a JSON or YAML body type.
    #[error("a write needs Content-Type: application/json (or application/yaml for a dataplane's definition), not {}; hdsd refuses the types a web page may send to another site without asking (text/plain, forms)", .0.as_deref().map_or("none".to_string(), shown))]
    ContentType(Option<String>),
}

impl Refusal {
    /// The HTTP status of the refusal.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Host(_) | Refusal::Origin { .. } => StatusCode::FORBIDDEN,
            Refusal::ContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }
}

/// Paths answered whatever the `Host` (load balancers and the kubelet
/// probe them by any name).
const ANY_HOST: &[&str] = &["/healthz", "/readyz"];

/// The rules, over one request's method, path and headers (`host`: the
/// `Host` header, or the authority of an HTTP/2 request).
pub fn check(
    rules: &Browsers,
    method: &Method,
    path: &str,
    host: Option<&str>,
    origin: Option<&str>,
    content_type: Option<&str>,
) -> Result<(), Refusal> {
    if rules.open && !ANY_HOST.contains(&path) {
        if let Some(host) = host {
            if !known_host(host, &rules.allowed_hosts) {
                return Err(Refusal::Host(host.to_string()));
            }
        }
    }
    let writes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !writes {
        return Ok(());
    }
    if let Some(origin) = origin {
        let own = host.is_some_and(|host| {
            let host = host.to_ascii_lowercase();
            let origin = origin.to_ascii_lowercase();
            origin == format!("http://{host}") || origin == format!("https://{host}")
        });
        if !own {
            return Err(Refusal::Origin {
                origin: origin.to_string(),
                host: host.unwrap_or_default().to_string(),
            });
        }
    }
    if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        let essence = content_type
            .and_then(|ct| ct.split(';').next())
            .map(|ct| ct.trim().to_ascii_lowercase());
        let fits = essence.as_deref().is_some_and(|ct| {
            ct == "application/json"
                || (ct.starts_with("application/") && ct.ends_with("+json"))
                || matches!(
                    ct,
                    "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml"
                )
        });
        if !fits {
            return Err(Refusal::ContentType(content_type.map(str::to_string)));
        }
    }
    Ok(())
}

/// Whether the open API answers to `host` (`name[:port]`, `[v6][:port]`).
fn known_host(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        // An IPv6 literal.
        Some(rest) => {
            return rest
                .split(']')
                .next()
                .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                name
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed.contains(&name)
}

/// The middleware: [`check`], or the refusal as the API's JSON error.
pub async fn guard(
    State(rules): State<Browsers>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers: &HeaderMap = request.headers();
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let authority = request.uri().authority().map(|a| a.as_str());
    let host = text(header::HOST).or(authority);
    // A header that is not text is refused like an unknown one.
    let bad = |name| headers.get(name).is_some_and(|v| v.to_str().is_err());
    let verdict = if bad(header::HOST) || bad(header::ORIGIN) {
        Err(Refusal::Host("(not text)".to_string()))
    } else {
        check(
            &rules,
            request.method(),
            request.uri().path(),
            host,
            text(header::ORIGIN),
            text(header::CONTENT_TYPE),
        )
    };
    match verdict {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            crate::metrics::api_refused(match refusal {
                Refusal::Host(_) => "host",
                Refusal::Origin { .. } => "origin",
                Refusal::ContentType(_) => "content_type",
            });
            super::error(refusal.status(), &refusal.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> Browsers {
        Browsers::new(&[], &["hdsd.internal".to_string()])
    }

    fn tokened() -> Browsers {
        Browsers::new(&["t".to_string()], &[])
    }

    const JSON: Option<&str> = Some("application/json");

    #[test]
    fn the_open_api_answers_ip_addresses_localhost_and_the_allowed_names_only() {
        let get = |host| {
            check(
                &open(),
                &Method::GET,
                "/api/v1/zones",
                Some(host),
                None,
                None,
            )
        };
        for ok in [
            "127.0.0.1:5680",
            "127.0.0.1",
            "[::1]:5680",
            "10.1.2.3:80",
            "localhost:5680",
            "LOCALHOST",
            "ui.localhost:5680",
            "hdsd.internal:5680",
            "hdsd.internal.",
        ] {
            assert_eq!(get(ok), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:5680",
            "localhost.evil.example",
            "[evil]:80",
        ] {
            assert!(matches!(get(bad), Err(Refusal::Host(_))), "{bad}");
        }
        // Probes answer whatever the Host; no Host (HTTP/1.0) is no name.
        assert_eq!(
            check(
                &open(),
                &Method::GET,
                "/readyz",
                Some("lb.example"),
                None,
                None
            ),
            Ok(())
        );
        assert_eq!(
            check(&open(), &Method::GET, "/api/v1/zones", None, None, None),
            Ok(())
        );
        // With api.tokens, every name (the token is the guard).
        assert_eq!(
            check(
                &tokened(),
                &Method::GET,
                "/api/v1/zones",
                Some("hdsd.example"),
                None,
                None
            ),
            Ok(())
        );
        let refused = get("evil.example").unwrap_err();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert!(
            refused.to_string().contains("api.allowed_hosts"),
            "{refused}"
        );
    }

    #[test]
    fn a_write_from_another_origin_is_refused_and_the_apis_own_is_not() {
        let host = Some("127.0.0.1:5680");
        for rules in [open(), tokened()] {
            let post = |origin| {
                check(
                    &rules,
                    &Method::POST,
                    "/api/v1/zones/ap-1/enable",
                    host,
                    origin,
                    JSON,
                )
            };
            assert_eq!(post(None), Ok(()), "the CLI sends no Origin");
            assert_eq!(post(Some("http://127.0.0.1:5680")), Ok(()));
            assert_eq!(post(Some("https://127.0.0.1:5680")), Ok(()));
            for bad in [
                "http://evil.example",
                "null",
                "http://127.0.0.1:9999",
                "http://127.0.0.1",
            ] {
                assert!(
                    matches!(post(Some(bad)), Err(Refusal::Origin { .. })),
                    "{bad}"
                );
            }
            let delete = check(
                &rules,
                &Method::DELETE,
                "/api/v1/zones/ap-1",
                host,
                Some("http://evil.example"),
                None,
            );
            assert!(matches!(delete, Err(Refusal::Origin { .. })));
            // A read from another origin is the browser's business (CORS:
            // the page cannot read the answer).
            assert_eq!(
                check(
                    &rules,
                    &Method::GET,
                    "/api/v1/zones",
                    host,
                    Some("http://evil.example"),
                    None
                ),
                Ok(())
            );
        }
    }

    #[test]
    fn writes_need_a_json_or_yaml_body_type() {
        let put = |ct| {
            check(
                &open(),
                &Method::PUT,
                "/api/v1/dataplanes/default/web",
                None,
                None,
                ct,
            )
        };
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/merge-patch+json",
            "application/yaml",
            "application/x-yaml",
            "text/yaml",
        ] {
            assert_eq!(put(Some(ok)), Ok(()), "{ok}");
        }
        for bad in [
            None,
            Some("text/plain"),
            Some("text/plain; a=application/json"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("text/json"),
        ] {
            let refused = put(bad).unwrap_err();
            assert!(matches!(refused, Refusal::ContentType(_)), "{bad:?}");
            assert_eq!(refused.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        }
        // A DELETE has no body.
        assert_eq!(
            check(
                &open(),
                &Method::DELETE,
                "/api/v1/zones/ap-1",
                None,
                None,
                None
            ),
            Ok(())
        );
    }
}
