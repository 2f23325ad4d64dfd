//! The one HTTP agent of the CLI: HTTP(S) to a running hdsd's REST API
//! (`--api`, with `--api-token` and `--ca`), for every command that reads
//! or changes it. Reads ([`Api::get_json`], [`Api::list_all`],
//! [`Api::events`]) fail with a [`ClientError`] that says what to fix;
//! writes ([`Api::send`]) return the status and the JSON answer, whatever
//! the status, for the command to put into words.

use std::io::BufRead;
use std::sync::Arc;

use super::ApiArgs;
use crate::view::{DataplaneItem, Paged};

/// Why a client could not be set up or the API not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum ClientError {
    #[error("cannot read --ca {path}: {message}; give a PEM file with the CA certificate that signed hdsd's api.tls certificate")]
    Ca { path: String, message: String },
    #[error("the API refused the token (HTTP 401); pass one of the server's api.tokens with --api-token")]
    Unauthorized,
    #[error("cannot read {url}: {message}; is hdsd running, and is --api its api.listen address (https:// when it has api.tls)?")]
    Read { url: String, message: String },
    #[error("{url}: no such item (HTTP 404); check the mesh and name (and --zone at a global): `hdsd status` lists them")]
    NotFound { url: String },
}

/// A running hdsd's REST API: the agent, the base address and the token.
#[derive(Debug, Clone)]
pub(super) struct Api {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

/// What a write sends: PUT and POST carry a body of a content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Method {
    Put {
        content_type: &'static str,
        body: String,
    },
    Post,
    Delete,
}

impl Api {
    /// The API that `args` name: plain HTTP, or HTTPS verified against the
    /// system's web roots, or against `--ca` when given.
    pub(super) fn connect(args: ApiArgs) -> Result<Api, ClientError> {
        use ureq::tls::{Certificate, RootCerts, TlsConfig};
        let mut tls = TlsConfig::builder();
        if let Some(path) = &args.ca {
            let err = |message: String| ClientError::Ca {
                path: path.display().to_string(),
                message,
            };
            let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
            let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                    Ok(_) => None,
                    Err(e) => Some(Err(err(e.to_string()))),
                })
                .collect::<Result<_, _>>()?;
            if certs.is_empty() {
                return Err(err("no CERTIFICATE block in the file".into()));
            }
            tls = tls.root_certs(RootCerts::Specific(Arc::new(certs)));
        }
        Ok(Api {
            agent: ureq::Agent::config_builder()
                .tls_config(tls.build())
                .build()
                .into(),
            base: args.api,
            token: args.api_token,
        })
    }

    /// `--api` as given.
    pub(super) fn base(&self) -> &str {
        &self.base
    }

    /// The URL of `path` (`/api/v1/...`).
    pub(super) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base.trim_end_matches('/'))
    }

    fn authorization(&self) -> Option<String> {
        self.token.as_ref().map(|t| format!("Bearer {t}"))
    }

    /// GETs `path` as JSON.
    pub(super) fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, ClientError> {
        let url = self.url(path);
        let mut request = self.agent.get(&url);
        if let Some(auth) = self.authorization() {
            request = request.header("Authorization", &auth);
        }
        let mut response = request.call().map_err(|e| read_error(&url, e))?;
        response
            .body_mut()
            .read_json()
            .map_err(|e| read_error(&url, e))
    }

    /// Every page of a list of dataplanes (`path`: `/api/v1/dataplanes` with
    /// its filters), following each `nextPageToken`, the largest pages the
    /// server gives.
    pub(super) fn list_all(&self, path: &str) -> Result<Vec<DataplaneItem>, ClientError> {
        let mut items = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let page_path = page_path(path, page_token.as_deref());
            let page: Paged<DataplaneItem> = self.get_json(&page_path)?;
            items.extend(page.items);
            match page.next_page_token.filter(|t| !t.is_empty()) {
                // A server that repeats a token would loop: stop there.
                Some(next) if page_token.as_deref() != Some(next.as_str()) => {
                    page_token = Some(next)
                }
                _ => return Ok(items),
            }
        }
    }

    /// Opens the event stream at `path` (`/api/v1/watch?...`), resuming
    /// after `last_event_id` when given: its lines.
    pub(super) fn events(
        &self,
        path: &str,
        last_event_id: Option<u64>,
    ) -> Result<impl BufRead, ClientError> {
        let url = self.url(path);
        let mut request = self.agent.get(&url);
        if let Some(auth) = self.authorization() {
            request = request.header("Authorization", &auth);
        }
        if let Some(r) = last_event_id {
            request = request.header("Last-Event-ID", &r.to_string());
        }
        let response = request.call().map_err(|e| read_error(&url, e))?;
        Ok(std::io::BufReader::new(response.into_body().into_reader()))
    }

    /// Sends `method` to `path` with the token: the status and the JSON
    /// answer (`null` when there is none), whatever the status; `Err` only
    /// when hdsd cannot be reached.
    pub(super) fn send(
        &self,
        method: Method,
        path: &str,
    ) -> Result<(u16, serde_json::Value), String> {
        let url = self.url(path);
        let auth = self.authorization();
        let response = match method {
            Method::Put { content_type, body } => {
                let mut request = self
                    .agent
                    .put(&url)
                    .config()
                    .http_status_as_error(false)
                    .build()
                    .header("Content-Type", content_type);
                if let Some(auth) = &auth {
                    request = request.header("Authorization", auth);
                }
                request.send(body.as_str())
            }
            Method::Post => {
                let mut request = self
                    .agent
                    .post(&url)
                    .config()
                    .http_status_as_error(false)
                    .build()
                    .header("Content-Type", "application/json");
                if let Some(auth) = &auth {
                    request = request.header("Authorization", auth);
                }
                request.send("")
            }
            Method::Delete => {
                let mut request = self
                    .agent
                    .delete(&url)
                    .config()
                    .http_status_as_error(false)
                    .build();
                if let Some(auth) = &auth {
                    request = request.header("Authorization", auth);
                }
                request.call()
            }
        };
        let mut response = response.map_err(|e| {
            format!(
                "cannot reach {url}: {e}; is hdsd running, and is --api its api.listen address?"
            )
        })?;
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().unwrap_or_default();
        let value = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
        Ok((status, value))
    }
}

/// A read that failed, as a [`ClientError`].
fn read_error(url: &str, e: ureq::Error) -> ClientError {
    match e {
        ureq::Error::StatusCode(401) => ClientError::Unauthorized,
        ureq::Error::StatusCode(404) => ClientError::NotFound {
            url: url.to_string(),
        },
        e => ClientError::Read {
            url: url.to_string(),
            message: e.to_string(),
        },
    }
}

/// `path` asking for the largest page, after `page_token` when given.
fn page_path(path: &str, page_token: Option<&str>) -> String {
    let separator = if path.contains('?') { '&' } else { '?' };
    let size = crate::consumers::paging::MAX_PAGE_SIZE;
    match page_token {
        Some(t) => format!("{path}{separator}page_size={size}&page_token={t}"),
        None => format!("{path}{separator}page_size={size}"),
    }
}

/// A query or path value, percent-encoded but for unreserved characters.
pub(super) fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(base: &str) -> Api {
        Api::connect(ApiArgs {
            api: base.into(),
            api_token: Some("t0k".into()),
            ca: None,
        })
        .unwrap()
    }

    #[test]
    fn paths_join_the_base_with_or_without_its_slash() {
        assert_eq!(
            api("http://h:1/").url("/api/v1/zones"),
            "http://h:1/api/v1/zones"
        );
        assert_eq!(
            api("http://h:1").url("/api/v1/zones"),
            "http://h:1/api/v1/zones"
        );
        assert_eq!(api("http://h:1/").base(), "http://h:1/");
        assert_eq!(
            api("http://h").authorization().as_deref(),
            Some("Bearer t0k")
        );
    }

    #[test]
    fn a_page_asks_for_the_largest_size_after_its_token() {
        let size = crate::consumers::paging::MAX_PAGE_SIZE;
        assert_eq!(
            page_path("/api/v1/dataplanes", None),
            format!("/api/v1/dataplanes?page_size={size}")
        );
        assert_eq!(
            page_path("/api/v1/dataplanes?mesh=a", Some("p2")),
            format!("/api/v1/dataplanes?mesh=a&page_size={size}&page_token=p2")
        );
    }

    #[test]
    fn values_are_percent_encoded_but_for_unreserved_characters() {
        assert_eq!(encode("web-01.a_b~"), "web-01.a_b~");
        assert_eq!(encode("a b&c/é"), "a%20b%26c%2F%C3%A9");
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_with_how_to_fix_it() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "not a pem\n").unwrap();
        let connect = |ca: std::path::PathBuf| {
            Api::connect(ApiArgs {
                api: "https://h:1".into(),
                api_token: None,
                ca: Some(ca),
            })
            .unwrap_err()
            .to_string()
        };
        let said = connect(empty);
        assert!(said.contains("no CERTIFICATE block"), "{said}");
        assert!(said.contains("give a PEM file"), "{said}");
        let said = connect(dir.path().join("missing.pem"));
        assert!(said.starts_with("cannot read --ca "), "{said}");
    }
}
