//! The client side of `hdsd status` and `hdsd watch`: HTTP(S) to the REST
//! API, the `/api/v1/watch` event stream, and what a change looks like to a
//! person. Parsing and describing are plain functions; the loop is at the end.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock as _, SystemClock};
use crate::view::{DataplaneItem, Paged};

/// Why a client could not be set up or the API not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read --ca {path}: {message}; give a PEM file with the CA certificate that signed hdsd's api.tls certificate")]
    Ca { path: String, message: String },
    #[error("the API refused the token (HTTP 401); pass one of the server's api.tokens with --api-token")]
    Unauthorized,
    #[error("cannot read {url}: {message}; is hdsd running, and is --api its api.listen address (https:// when it has api.tls)?")]
    Read { url: String, message: String },
    #[error("{url}: no such item (HTTP 404); check the mesh and name (and --zone at a global): `hdsd status` lists them")]
    NotFound { url: String },
}

/// An HTTP agent for the API: plain HTTP, or HTTPS verified against the
/// system's web roots, or against `ca` when given.
pub fn agent(ca: Option<&Path>) -> Result<ureq::Agent, ClientError> {
    use ureq::tls::{Certificate, RootCerts, TlsConfig};
    let mut tls = TlsConfig::builder();
    if let Some(path) = ca {
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
    Ok(ureq::Agent::config_builder()
        .tls_config(tls.build())
        .build()
        .into())
}

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

/// GETs `path` from the API at `base` as JSON.
pub fn get_json<T: serde::de::DeserializeOwned>(
    agent: &ureq::Agent,
    base: &str,
    path: &str,
    token: Option<&str>,
) -> Result<T, ClientError> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut request = agent.get(&url);
    if let Some(token) = token {
        request = request.header("Authorization", &format!("Bearer {token}"));
    }
    let mut response = request.call().map_err(|e| read_error(&url, e))?;
    response
        .body_mut()
        .read_json()
        .map_err(|e| read_error(&url, e))
}

/// Every dataplane (of `mesh`, when given).
pub fn list(
    agent: &ureq::Agent,
    base: &str,
    token: Option<&str>,
    mesh: Option<&str>,
) -> Result<Vec<DataplaneItem>, ClientError> {
    let path = match mesh {
        Some(m) => format!("/api/v1/dataplanes?mesh={m}"),
        None => "/api/v1/dataplanes".to_string(),
    };
    list_all(agent, base, &path, token)
}

/// Every page of a list of dataplanes (`path`: `/api/v1/dataplanes` with
/// its filters), following each `nextPageToken`, the largest pages the
/// server gives.
pub fn list_all(
    agent: &ureq::Agent,
    base: &str,
    path: &str,
    token: Option<&str>,
) -> Result<Vec<DataplaneItem>, ClientError> {
    let mut items = Vec::new();
    let mut page_token: Option<String> = None;
    loop {
        let page_path = page_path(path, page_token.as_deref());
        let page: Paged<DataplaneItem> = get_json(agent, base, &page_path, token)?;
        items.extend(page.items);
        match page.next_page_token.filter(|t| !t.is_empty()) {
            // A server that repeats a token would loop: stop there.
            Some(next) if page_token.as_deref() != Some(next.as_str()) => page_token = Some(next),
            _ => return Ok(items),
        }
    }
}

/// `path` asking for the largest page, after `page_token` when given.
pub fn page_path(path: &str, page_token: Option<&str>) -> String {
    let separator = if path.contains('?') { '&' } else { '?' };
    let size = crate::consumers::paging::MAX_PAGE_SIZE;
    match page_token {
        Some(t) => format!("{path}{separator}page_size={size}&page_token={t}"),
        None => format!("{path}{separator}page_size={size}"),
    }
}

/// One server-sent event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// Reads an event stream line by line (the parts of the SSE format hdsd sends).
#[derive(Debug, Default)]
pub struct SseParser {
    current: SseEvent,
}

impl SseParser {
    /// Feeds one line (without its newline); returns an event when it ends.
    pub fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            if self.current.event.is_empty() && self.current.data.is_empty() {
                return None;
            }
            return Some(std::mem::take(&mut self.current));
        }
        if line.starts_with(':') {
            return None; // a comment: keep-alive
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.current.event = value.to_string(),
            "id" => self.current.id = Some(value.to_string()),
            "data" => {
                if !self.current.data.is_empty() {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
            }
            _ => {}
        }
        None
    }
}

fn inbound_name(i: &crate::view::InboundItem) -> String {
    let service = i
        .tags
        .get("kuma.io/service")
        .map_or("inbound", String::as_str);
    format!("{service}:{}", i.service_port)
}

/// What changed between two views of a dataplane, in words.
pub fn describe(before: Option<&DataplaneItem>, after: Option<&DataplaneItem>) -> Vec<String> {
    let mut out = Vec::new();
    match (before, after) {
        (None, None) => {}
        (Some(_), None) => out.push("deleted".to_string()),
        (None, Some(a)) => {
            out.push(format!(
                "{} ({})",
                if a.is_ready() { "ready" } else { "not ready" },
                if a.connection.connected {
                    "connected"
                } else {
                    "not connected"
                }
            ));
            for i in &a.inbounds {
                out.push(format!("{} {}", inbound_name(i), i.health.status));
            }
        }
        (Some(b), Some(a)) => {
            if b.connection.connected != a.connection.connected {
                out.push(
                    if a.connection.connected {
                        "connected"
                    } else {
                        "disconnected"
                    }
                    .into(),
                );
            } else if b.connection.connected_at != a.connection.connected_at {
                out.push("reconnected".into());
            }
            let before: BTreeMap<u16, &crate::view::InboundItem> =
                b.inbounds.iter().map(|i| (i.port, i)).collect();
            for i in &a.inbounds {
                match before.get(&i.port) {
                    Some(old) if old.health.status != i.health.status => out.push(format!(
                        "{} {} -> {}",
                        inbound_name(i),
                        old.health.status,
                        i.health.status
                    )),
                    Some(old) if old == &i => {}
                    Some(_) => out.push(format!("{} redefined", inbound_name(i))),
                    None => out.push(format!("{} added ({})", inbound_name(i), i.health.status)),
                }
            }
            for i in &b.inbounds {
                if !a.inbounds.iter().any(|n| n.port == i.port) {
                    out.push(format!("{} removed", inbound_name(i)));
                }
            }
            if b.address != a.address {
                out.push(format!("address {} -> {}", b.address, a.address));
            }
            if out.is_empty() {
                out.push("changed".into());
            }
        }
    }
    out
}

/// Reconnect delays: 1 s doubling to 30 s, each with up to 50% jitter
/// (Envoy's own backoff), back to 1 s once connected.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: Self::FIRST }
    }
}

impl Backoff {
    pub const FIRST: Duration = Duration::from_secs(1);
    pub const MAX: Duration = Duration::from_secs(30);

    /// The next delay; `jitter` in [0, 1) picks where in [d/2, d] it lands.
    pub fn next(&mut self, jitter: f64) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        base.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// What `hdsd watch` follows and how it prints.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    pub api: String,
    pub token: Option<String>,
    pub mesh: Option<String>,
    /// `k=v` tags an inbound must carry.
    pub selector: Vec<(String, String)>,
    /// On a global: only this zone's dataplanes (`local`: the global's own).
    pub zone: Option<String>,
    /// Only changes of dataplanes that are not ready, or were before the
    /// change (so that a recovery shows too).
    pub not_ready: bool,
    pub json: bool,
}

impl WatchOptions {
    /// Whether a change from `before` to `after` is shown.
    fn shows(&self, before: Option<&DataplaneItem>, after: Option<&DataplaneItem>) -> bool {
        let not_ready = |d: Option<&DataplaneItem>| {
            d.is_some_and(|d| d.inbounds.iter().any(|i| !i.health.ready))
        };
        !self.not_ready || not_ready(before) || not_ready(after)
    }

    fn url(&self) -> String {
        let mut query = Vec::new();
        if let Some(m) = &self.mesh {
            query.push(format!("mesh={m}"));
        }
        if let Some(z) = &self.zone {
            query.push(format!("zone={z}"));
        }
        if !self.selector.is_empty() {
            let s: Vec<String> = self
                .selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            query.push(format!("selector={}", s.join(",")));
        }
        let mut url = format!("{}/api/v1/watch", self.api.trim_end_matches('/'));
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query.join("&"));
        }
        url
    }
}

/// The state of a watch across reconnects.
#[derive(Debug, Default)]
pub struct Follower {
    /// The last revision seen: where a reconnect resumes.
    pub revision: Option<u64>,
    known: BTreeMap<Key, DataplaneItem>,
}

impl Follower {
    /// Follows the stream until it ends (Ok) or fails; prints to `out`.
    pub fn follow_once(
        &mut self,
        agent: &ureq::Agent,
        options: &WatchOptions,
        out: &mut dyn Write,
        on_connected: &mut dyn FnMut(Option<u64>),
    ) -> Result<(), ClientError> {
        let url = options.url();
        let mut request = agent.get(&url);
        if let Some(token) = &options.token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        if let Some(r) = self.revision {
            request = request.header("Last-Event-ID", &r.to_string());
        }
        let response = request.call().map_err(|e| read_error(&url, e))?;
        on_connected(self.revision);
        let reader = BufReader::new(response.into_body().into_reader());
        let mut parser = SseParser::default();
        for line in reader.lines() {
            let line = line.map_err(|e| ClientError::Read {
                url: url.clone(),
                message: e.to_string(),
            })?;
            if let Some(event) = parser.line(&line) {
                self.on_event(agent, options, &event, out)?;
                if let Some(r) = event.id.as_deref().and_then(|i| i.parse().ok()) {
                    self.revision = Some(r);
                }
            }
        }
        Ok(())
    }

    fn on_event(
        &mut self,
        agent: &ureq::Agent,
        options: &WatchOptions,
        event: &SseEvent,
        out: &mut dyn Write,
    ) -> Result<(), ClientError> {
        let data: serde_json::Value = serde_json::from_str(&event.data).unwrap_or_default();
        let now = SystemClock
            .now()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let token = options.token.as_deref();
        let mut lines: Vec<(String, Vec<String>)> = Vec::new();
        match event.event.as_str() {
            "snapshot" => {
                let items = list(agent, &options.api, token, options.mesh.as_deref())?;
                let wanted: std::collections::BTreeSet<Key> = data["snapshot"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(Key::of_event)
                    .collect();
                let old = std::mem::take(&mut self.known);
                for item in items {
                    let key = Key::of_item(&item);
                    if !wanted.contains(&key) {
                        continue;
                    }
                    let what = describe(old.get(&key), Some(&item));
                    if old.get(&key) != Some(&item) && options.shows(old.get(&key), Some(&item)) {
                        lines.push((key.to_string(), what));
                    }
                    self.known.insert(key, item);
                }
                for (key, item) in &old {
                    if !self.known.contains_key(key) && options.shows(Some(item), None) {
                        lines.push((key.to_string(), describe(Some(item), None)));
                    }
                }
                for z in data["zones"].as_array().into_iter().flatten() {
                    lines.push(zone_line(z));
                }
            }
            "zone_changed" | "zone_deleted" => lines.push(zone_line(&data["zone"])),
            "changed" | "deleted" => {
                let key = Key::of_event(&data["dataplane"]);
                let after = if event.event == "changed" {
                    let path = key.path();
                    match get_json::<DataplaneItem>(agent, &options.api, &path, token) {
                        Ok(item) => Some(item),
                        // Deleted since: a DELETED event follows.
                        Err(ClientError::Read { .. } | ClientError::NotFound { .. }) => None,
                        Err(e) => return Err(e),
                    }
                } else {
                    None
                };
                let before = self.known.get(&key);
                if before != after.as_ref() && options.shows(before, after.as_ref()) {
                    lines.push((key.to_string(), describe(before, after.as_ref())));
                }
                match after {
                    Some(item) => self.known.insert(key, item),
                    None => self.known.remove(&key),
                };
            }
            "resync" => {
                eprintln!(
                    "hdsd asks for a resync ({}): reading the full state again",
                    data["resyncReason"].as_str().unwrap_or("unknown")
                );
            }
            _ => {}
        }
        let io = |e: std::io::Error| ClientError::Read {
            url: "stdout".into(),
            message: e.to_string(),
        };
        if options.json {
            let mut data = data;
            if let Some(obj) = data.as_object_mut() {
                obj.insert("time".into(), now.clone().into());
                if !lines.is_empty() {
                    obj.insert(
                        "changes".into(),
                        lines
                            .iter()
                            .map(|(id, what)| serde_json::json!({ "dataplane": id, "what": what }))
                            .collect(),
                    );
                }
            }
            writeln!(out, "{data}").map_err(io)?;
        } else {
            for (id, what) in &lines {
                writeln!(out, "{now} {id} {}", what.join(", ")).map_err(io)?;
            }
        }
        out.flush().map_err(io)
    }
}

/// A dataplane a watch follows: its zone (empty for the server's own),
/// mesh and name. Shown as `mesh.name`, or `zone/mesh.name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    zone: String,
    mesh: String,
    name: String,
}

impl Key {
    /// The dataplane of a watch event (`mesh`, `name`, `zone`).
    fn of_event(d: &serde_json::Value) -> Key {
        let field = |f: &str| d[f].as_str().unwrap_or_default().to_string();
        Key {
            zone: field("zone"),
            mesh: field("mesh"),
            name: field("name"),
        }
    }

    fn of_item(item: &DataplaneItem) -> Key {
        Key {
            zone: item
                .zone
                .as_ref()
                .map(|z| z.name.clone())
                .unwrap_or_default(),
            mesh: item.mesh.clone(),
            name: item.name.clone(),
        }
    }

    /// Where the API serves it.
    fn path(&self) -> String {
        match self.zone.as_str() {
            "" => format!("/api/v1/dataplanes/{}/{}", self.mesh, self.name),
            zone => format!(
                "/api/v1/zones/{zone}/dataplanes/{}/{}",
                self.mesh, self.name
            ),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.zone.is_empty() {
            write!(f, "{}/", self.zone)?;
        }
        write!(f, "{}.{}", self.mesh, self.name)
    }
}

/// A zone event's line: `zone eu-1`, and its state (or `deleted`).
fn zone_line(z: &serde_json::Value) -> (String, Vec<String>) {
    let name = z["name"].as_str().unwrap_or_default();
    let what = z["state"].as_str().unwrap_or("deleted").replace('_', " ");
    (format!("zone {name}"), vec![what])
}

/// `hdsd watch`: follows until a fatal error (a refused token), reconnecting
/// with backoff and resuming from the last revision; says so on stderr.
pub fn watch(agent: &ureq::Agent, options: &WatchOptions) -> Result<(), ClientError> {
    let mut follower = Follower::default();
    let mut backoff = Backoff::default();
    let mut stdout = std::io::stdout();
    loop {
        let result = follower.follow_once(agent, options, &mut stdout, &mut |since| {
            backoff.reset();
            if let Some(r) = since {
                eprintln!(
                    "reconnected to {}; resuming after revision {r}",
                    options.api
                );
            }
        });
        let why = match result {
            Ok(()) => "the server ended the stream".to_string(),
            Err(ClientError::Unauthorized) => return Err(ClientError::Unauthorized),
            Err(e) => e.to_string(),
        };
        let delay = backoff.next(rand::random::<f64>());
        match follower.revision {
            Some(r) => eprintln!(
                "{why}; reconnecting in {:.1}s, resuming after revision {r}",
                delay.as_secs_f64()
            ),
            None => eprintln!("{why}; reconnecting in {:.1}s", delay.as_secs_f64()),
        }
        std::thread::sleep(delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{ConnectionItem, HealthItem, InboundItem};
    use chrono::{TimeZone, Utc};

    #[test]
    fn the_sse_parser_reads_events_and_skips_keep_alives() {
        let mut p = SseParser::default();
        let mut events = Vec::new();
        for line in [
            "event: changed",
            "data: {\"a\":1}",
            "id: 7",
            "",
            ":",
            "",
            "event: synced",
            "data:{}",
            "",
        ] {
            events.extend(p.line(line));
        }
        assert_eq!(
            events,
            [
                SseEvent {
                    event: "changed".into(),
                    id: Some("7".into()),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: "synced".into(),
                    id: None,
                    data: "{}".into()
                }
            ]
        );
    }

    #[test]
    fn backoff_doubles_from_one_second_to_thirty_with_jitter() {
        let mut b = Backoff::default();
        let full: Vec<u64> = (0..7).map(|_| b.next(1.0).as_secs()).collect();
        assert_eq!(full, [1, 2, 4, 8, 16, 30, 30]);
        b.reset();
        assert_eq!(b.next(0.0), Duration::from_millis(500));
    }

    fn item(status: &str, connected: bool) -> DataplaneItem {
        let t = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        DataplaneItem {
            mesh: "default".into(),
            name: "web-01".into(),
            address: "127.0.0.1".parse().unwrap(),
            kind: crate::dataplane::DataplaneKind::Sidecar,
            listeners: Vec::new(),
            zone: None,
            connection: ConnectionItem {
                connected,
                connected_at: Some(t),
                last_report_at: None,
                held_by: None,
                envoy_version: None,
                problem: None,
                token_expires_at: None,
            },
            inbounds: vec![InboundItem {
                port: 10001,
                service_port: 8080,
                service_address: "127.0.0.1".parse().unwrap(),
                name: None,
                state: crate::dataplane::InboundState::Ready,
                tags: [("kuma.io/service".to_string(), "web".to_string())].into(),
                health: HealthItem {
                    ready: status == "healthy",
                    status: status.into(),
                    since: t,
                    last_report_at: None,
                    failing_reports: 0,
                    last_healthy_at: None,
                    changes: vec![],
                    reason: None,
                },
                probe: None,
            }],
        }
    }

    #[test]
    fn watch_filters_reach_the_url_and_not_ready_keeps_recoveries() {
        let mut o = WatchOptions {
            api: "http://h:1/".into(),
            token: None,
            mesh: Some("default".into()),
            selector: Vec::new(),
            zone: Some("eu-1".into()),
            not_ready: false,
            json: false,
        };
        assert_eq!(o.url(), "http://h:1/api/v1/watch?mesh=default&zone=eu-1");
        let (ready, down) = (item("healthy", true), item("unhealthy", true));
        let reconnected = item("healthy", false);
        assert!(o.shows(Some(&ready), Some(&reconnected)));
        o.not_ready = true;
        // Ready before and after: not shown.
        assert!(!o.shows(Some(&ready), Some(&reconnected)));
        assert!(!o.shows(None, Some(&ready)));
        assert!(!o.shows(Some(&ready), None));
        // Going not ready, recovering, and a not-ready one deleted: shown.
        assert!(o.shows(Some(&ready), Some(&down)));
        assert!(o.shows(Some(&down), Some(&ready)));
        assert!(o.shows(Some(&down), None));
    }

    #[test]
    fn changes_are_described_in_words() {
        let a = item("healthy", true);
        let b = item("unhealthy", true);
        assert_eq!(
            describe(Some(&a), Some(&b)),
            ["web:8080 healthy -> unhealthy"]
        );
        assert_eq!(
            describe(Some(&b), Some(&item("unhealthy", false))),
            ["disconnected"]
        );
        assert_eq!(describe(Some(&a), None), ["deleted"]);
        assert_eq!(
            describe(None, Some(&a)),
            ["ready (connected)", "web:8080 healthy"]
        );
    }
}
