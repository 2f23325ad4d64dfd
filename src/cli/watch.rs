//! `hdsd watch`: follows `/api/v1/watch`, the event stream of a running
//! hdsd, and says what changed, in words (or as JSON), one line per change;
//! it reconnects with backoff and resumes from the last revision. Parsing
//! and describing are plain functions; the loop is at the end.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write};
use std::process::ExitCode;
use std::time::Duration;

use super::http::{Api, ClientError};
use super::ApiArgs;
use crate::clock::{Clock as _, SystemClock};
use crate::view::DataplaneItem;

/// `hdsd watch`'s arguments.
#[derive(clap::Args)]
pub(super) struct WatchArgs {
    #[command(flatten)]
    pub(super) api: ApiArgs,
    #[command(flatten)]
    options: WatchOptions,
}

impl WatchArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let api = Api::connect(self.api)?;
        watch(&api, &self.options)?;
        Ok(ExitCode::SUCCESS)
    }
}

/// One server-sent event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SseEvent {
    event: String,
    id: Option<String>,
    data: String,
}

/// Reads an event stream line by line (the parts of the SSE format hdsd sends).
#[derive(Debug, Default)]
struct SseParser {
    current: SseEvent,
}

impl SseParser {
    /// Feeds one line (without its newline); returns an event when it ends.
    fn line(&mut self, line: &str) -> Option<SseEvent> {
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
fn describe(before: Option<&DataplaneItem>, after: Option<&DataplaneItem>) -> Vec<String> {
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
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: Self::FIRST }
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    /// The next delay; `jitter` in [0, 1) picks where in [d/2, d] it lands.
    fn next(&mut self, jitter: f64) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        base.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// What `hdsd watch` follows and how it prints.
#[derive(clap::Args, Debug, Clone, Default)]
struct WatchOptions {
    /// Only dataplanes of this mesh.
    #[arg(long)]
    mesh: Option<String>,
    /// Only dataplanes with an inbound carrying this tag (repeatable): k=v.
    #[arg(long = "selector", value_parser = super::parse_tag)]
    selector: Vec<(String, String)>,
    /// On a global: only this zone's dataplanes (`local`: the global's own).
    #[arg(long)]
    zone: Option<String>,
    /// Only changes of dataplanes with an inbound not ready (before or
    /// after the change, so that recoveries show too); zone lines always.
    #[arg(long)]
    not_ready: bool,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

impl WatchOptions {
    /// Whether a change from `before` to `after` is shown.
    fn shows(&self, before: Option<&DataplaneItem>, after: Option<&DataplaneItem>) -> bool {
        let not_ready = |d: Option<&DataplaneItem>| {
            d.is_some_and(|d| d.inbounds.iter().any(|i| !i.health.ready))
        };
        !self.not_ready || not_ready(before) || not_ready(after)
    }

    /// The event stream's path, with the filters the server applies.
    fn path(&self) -> String {
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
        let mut path = "/api/v1/watch".to_string();
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query.join("&"));
        }
        path
    }
}

/// The state of a watch across reconnects.
#[derive(Debug, Default)]
struct Follower {
    /// The last revision seen: where a reconnect resumes.
    revision: Option<u64>,
    known: BTreeMap<Key, DataplaneItem>,
}

impl Follower {
    /// Follows the stream until it ends (Ok) or fails; prints to `out`.
    fn follow_once(
        &mut self,
        api: &Api,
        options: &WatchOptions,
        out: &mut dyn Write,
        on_connected: &mut dyn FnMut(Option<u64>),
    ) -> Result<(), ClientError> {
        let path = options.path();
        let url = api.url(&path);
        let reader = api.events(&path, self.revision)?;
        on_connected(self.revision);
        let mut parser = SseParser::default();
        for line in reader.lines() {
            let line = line.map_err(|e| ClientError::Read {
                url: url.clone(),
                message: e.to_string(),
            })?;
            if let Some(event) = parser.line(&line) {
                self.on_event(api, options, &event, out)?;
                if let Some(r) = event.id.as_deref().and_then(|i| i.parse().ok()) {
                    self.revision = Some(r);
                }
            }
        }
        Ok(())
    }

    fn on_event(
        &mut self,
        api: &Api,
        options: &WatchOptions,
        event: &SseEvent,
        out: &mut dyn Write,
    ) -> Result<(), ClientError> {
        let data: serde_json::Value = serde_json::from_str(&event.data).unwrap_or_default();
        let now = SystemClock
            .now()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let mut lines: Vec<(String, Vec<String>)> = Vec::new();
        match event.event.as_str() {
            "snapshot" => {
                let items = list(api, options.mesh.as_deref())?;
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
                    match api.get_json::<DataplaneItem>(&path) {
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

/// Every dataplane (of `mesh`, when given).
fn list(api: &Api, mesh: Option<&str>) -> Result<Vec<DataplaneItem>, ClientError> {
    match mesh {
        Some(m) => api.list_all(&format!("/api/v1/dataplanes?mesh={m}")),
        None => api.list_all("/api/v1/dataplanes"),
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
fn watch(api: &Api, options: &WatchOptions) -> Result<(), ClientError> {
    let mut follower = Follower::default();
    let mut backoff = Backoff::default();
    let mut stdout = std::io::stdout();
    loop {
        let result = follower.follow_once(api, options, &mut stdout, &mut |since| {
            backoff.reset();
            if let Some(r) = since {
                eprintln!("reconnected to {}; resuming after revision {r}", api.base());
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
                operator_word: None,
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
            mesh: Some("default".into()),
            selector: Vec::new(),
            zone: Some("eu-1".into()),
            not_ready: false,
            json: false,
        };
        assert_eq!(o.path(), "/api/v1/watch?mesh=default&zone=eu-1");
        o.selector = vec![("k".into(), "v".into()), ("app".into(), "web".into())];
        assert_eq!(
            o.path(),
            "/api/v1/watch?mesh=default&zone=eu-1&selector=k=v,app=web"
        );
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
