//! `hdsd status`: the readiness table, read from the REST API (every page
//! of the dataplanes the filters select, the dataplane files' problems and
//! the zones), once, as JSON, or refreshed in place every second. The
//! renderers are plain functions of what was read and the time.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::http::{encode, Api, ClientError};
use super::ApiArgs;
use crate::clock::{Clock as _, SystemClock};
use crate::dataplane::{DataplaneKind, InboundState};
use crate::operator::OperatorWord;
use crate::readiness::Timestamp;
use crate::view::DataplaneItem;

/// `hdsd status`'s arguments.
#[derive(clap::Args)]
pub(super) struct StatusArgs {
    #[command(flatten)]
    pub(super) api: ApiArgs,
    /// Refresh the table in place every second.
    #[arg(long)]
    watch: bool,
    /// Only dataplanes of this mesh.
    #[arg(long)]
    mesh: Option<String>,
    /// Only dataplanes with an inbound of this `kuma.io/service`.
    #[arg(long)]
    service: Option<String>,
    /// On a global: only this zone's dataplanes (`local`: the global's own).
    #[arg(long)]
    zone: Option<String>,
    /// Only dataplanes with an inbound that is not ready.
    #[arg(long)]
    not_ready: bool,
    /// Only dataplanes with an inbound in one of these statuses
    /// (`unhealthy`, `timeout`, `stale`, ...; repeat or separate with commas).
    #[arg(long, value_delimiter = ',')]
    status: Vec<String>,
    /// Print the dataplanes (and the zones) as JSON instead of a table.
    #[arg(long, conflicts_with = "watch")]
    json: bool,
}

impl StatusArgs {
    /// The filters the server applies.
    fn filter(&self) -> Filter {
        Filter {
            mesh: self.mesh.clone(),
            service: self.service.clone(),
            zone: self.zone.clone(),
            not_ready: self.not_ready,
            status: self.status.clone(),
        }
    }

    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let filter = self.filter();
        let api = Api::connect(self.api)?;
        // An hdsd without zones, or one older than them, answers 404 or an
        // empty list: the status has no zones part then.
        let zones = || -> ZonesAnswer { api.get_json("/api/v1/zones").unwrap_or_default() };
        // Definitions through the API have no files: nothing to list then.
        let sources =
            || -> Option<crate::api::SourcesView> { api.get_json("/api/v1/sources").ok() };
        // Every page the server gives for the filters.
        let list = || -> Result<Vec<DataplaneItem>, ClientError> { api.list_all(&filter.path()) };
        if self.json {
            let files = sources().map(|s| s.files).unwrap_or_default();
            let warned: Vec<_> = files
                .iter()
                .filter(|f| !f.warnings.is_empty())
                .map(|f| serde_json::json!({ "path": f.path, "warnings": f.warnings }))
                .collect();
            let broken: Vec<_> = files.into_iter().filter(|f| f.error.is_some()).collect();
            let out = serde_json::json!({
                "items": list()?,
                "zones": zones(),
                "brokenFiles": broken,
                "fileWarnings": warned,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
            return Ok(ExitCode::SUCCESS);
        }
        if !self.watch {
            print!("{}", render_now(&list()?, sources().as_ref(), &zones()));
            return Ok(ExitCode::SUCCESS);
        }
        let mut stdout = std::io::stdout();
        loop {
            let screen = match list() {
                Ok(items) => render_now(&items, sources().as_ref(), &zones()),
                Err(e) => format!("{e}\n"),
            };
            // Home the cursor and clear the screen, then draw: refresh in place.
            write!(stdout, "\x1b[H\x1b[2J{screen}")?;
            stdout.flush()?;
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// Which dataplanes `hdsd status` shows (`--mesh`, `--service`, `--zone`,
/// `--not-ready`, `--status`): the server filters them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Filter {
    mesh: Option<String>,
    service: Option<String>,
    zone: Option<String>,
    not_ready: bool,
    /// Inbound status words (`unhealthy`, `stale`, ...): any of them.
    status: Vec<String>,
}

impl Filter {
    /// The API request that lists them.
    fn path(&self) -> String {
        let mut query = Vec::new();
        if let Some(mesh) = &self.mesh {
            query.push(format!("mesh={}", encode(mesh)));
        }
        if let Some(service) = &self.service {
            query.push(format!("service={}", encode(service)));
        }
        if let Some(zone) = &self.zone {
            query.push(format!("zone={}", encode(zone)));
        }
        if self.not_ready {
            query.push("ready=false".to_string());
        }
        if !self.status.is_empty() {
            let words: Vec<String> = self.status.iter().map(|s| encode(s)).collect();
            query.push(format!("status={}", words.join(",")));
        }
        match query.is_empty() {
            true => "/api/v1/dataplanes".to_string(),
            false => format!("/api/v1/dataplanes?{}", query.join("&")),
        }
    }
}

/// `GET /api/v1/zones` as `hdsd status` reads it: a global's zones, a
/// zone's uplink (both empty on a standalone hdsd, or an older one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ZonesAnswer {
    items: Vec<ZoneLine>,
    uplink: Option<UplinkLine>,
}

/// One zone of a global.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ZoneLine {
    name: String,
    state: String,
    since: Option<Timestamp>,
    last_seen: Option<Timestamp>,
    dataplanes: usize,
    inbounds: ZoneInbounds,
    withdrawn: bool,
}

/// A zone's inbounds, ready and in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
struct ZoneInbounds {
    ready: usize,
    total: usize,
}

/// A zone's link to its global.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct UplinkLine {
    zone: String,
    /// `connecting`, `connected`, `disconnected`, `standby` (absent from
    /// an older hdsd).
    state: Option<String>,
    connected: bool,
    /// The instance holding the zone's uplink lease.
    holder: Option<String>,
    global: Option<String>,
    problem: Option<String>,
}

/// The zones part of `hdsd status`: one line per zone of a global, or the
/// zone's link to its global; empty when there is neither.
fn render_zones(zones: &ZonesAnswer, now: Timestamp) -> String {
    let mut out = String::new();
    if !zones.items.is_empty() {
        let _ = writeln!(out, "\nZones:");
        for z in &zones.items {
            let _ = writeln!(
                out,
                "  {:<20} {:<16} last seen {:<10} {} dataplanes, {}/{} inbounds ready{}",
                z.name,
                z.state,
                ago(z.last_seen, now),
                z.dataplanes,
                z.inbounds.ready,
                z.inbounds.total,
                if z.withdrawn { " (withdrawn)" } else { "" }
            );
        }
    }
    if let Some(u) = &zones.uplink {
        let link = match (u.connected, &u.global, u.state.as_deref(), &u.holder) {
            (true, Some(g), _, _) => format!("connected to {g}"),
            (true, None, _, _) => "connected".to_string(),
            (false, _, Some("standby"), Some(holder)) => {
                format!("standby (instance {holder} holds the uplink to the global)")
            }
            (false, _, _, _) => "not connected".to_string(),
        };
        let _ = writeln!(out, "\nZone {}: {link}", u.zone);
        if let Some(p) = &u.problem {
            let _ = writeln!(out, "  {p}");
        }
    }
    out
}

/// Renders the table: one line per inbound (named `PORT (NAME)` when the
/// inbound has a name); a dataplane without inbounds (a gateway, a zone proxy)
/// gets one line saying there is nothing to probe.
fn render(items: &[DataplaneItem], now: Timestamp) -> String {
    let mut rows = vec![[
        "DATAPLANE".to_string(),
        "CONNECTED".into(),
        "ENVOY".into(),
        "INBOUND".into(),
        "SERVICE".into(),
        "STATUS".into(),
        "READY".into(),
        "SINCE".into(),
        "LAST REPORT".into(),
    ]];
    for d in items {
        // A zone's dataplane (on a global) is named with its zone.
        let id = match &d.zone {
            Some(z) => format!("{}/{}.{}", z.name, d.mesh, d.name),
            None => format!("{}.{}", d.mesh, d.name),
        };
        if d.inbounds.is_empty() {
            let what = match d.kind {
                DataplaneKind::Sidecar => "-".to_string(),
                DataplaneKind::Gateway => "gateway".to_string(),
                DataplaneKind::ZoneProxy => {
                    let listeners: Vec<String> = d
                        .listeners
                        .iter()
                        .map(|l| format!("{} {}", l.kind, l.port))
                        .collect();
                    format!("zone proxy ({})", listeners.join(", "))
                }
            };
            rows.push([
                id.clone(),
                connected(d),
                envoy(d),
                "-".into(),
                what,
                "nothing to probe".into(),
                "-".into(),
                "-".into(),
                ago(d.connection.last_report_at, now),
            ]);
        }
        for i in &d.inbounds {
            let service = i
                .tags
                .get("kuma.io/service")
                .cloned()
                .unwrap_or_else(|| "-".into());
            rows.push([
                id.clone(),
                connected(d),
                envoy(d),
                match &i.name {
                    Some(name) => format!("{} ({name})", i.port),
                    None => format!("{}", i.port),
                },
                format!(
                    "{service} ({}:{}{})",
                    fmt_ip(i.service_address),
                    i.service_port,
                    // Probed over TLS.
                    if i.probe.as_ref().is_some_and(|p| p.tls.is_some()) {
                        ", TLS"
                    } else {
                        ""
                    }
                ),
                // The operator's word beside the health (an older server
                // sends no word, only the declared state).
                match (&i.operator_word, i.state) {
                    (Some(OperatorWord::Unknown), _) => {
                        format!("{} (held by its zone)", i.health.status)
                    }
                    (Some(OperatorWord::DeclaredNotReady), _) | (None, InboundState::NotReady) => {
                        format!("{} (declared NotReady)", i.health.status)
                    }
                    _ => i.health.status.clone(),
                },
                yes_no(i.health.ready),
                ago(Some(i.health.since), now),
                ago(i.health.last_report_at, now),
            ]);
        }
    }
    let widths: Vec<usize> = (0..9)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    // Ignored inbounds are left out of the readiness count.
    let counted = || {
        items
            .iter()
            .flat_map(|d| &d.inbounds)
            .filter(|i| i.state != InboundState::Ignored)
    };
    let inbounds = counted().count();
    let ready = counted().filter(|i| i.health.ready).count();
    let ignored = items.iter().flat_map(|d| &d.inbounds).count() - inbounds;
    let connected = items.iter().filter(|d| d.connection.connected).count();
    let _ = write!(
        out,
        "\n{} dataplanes ({connected} connected), {ready}/{inbounds} inbounds ready",
        items.len()
    );
    let _ = match ignored {
        0 => writeln!(out),
        n => writeln!(out, " ({n} ignored)"),
    };
    let earliest = items
        .iter()
        .filter_map(|d| Some((d.connection.token_expires_at?, d)))
        .min_by_key(|(at, _)| *at);
    if let Some((at, d)) = earliest {
        let _ = writeln!(
            out,
            "Earliest token expiry: {}.{} at {} ({}); renew it before (docs/security.md, Rotating tokens)",
            d.mesh,
            d.name,
            at.to_rfc3339(),
            until(at, now)
        );
    }
    // Reasons: what is wrong and what to do, one line each.
    let mut why = Vec::new();
    for d in items {
        if let Some(p) = &d.connection.problem {
            why.push(format!("{}.{}: {}", d.mesh, d.name, p.message));
        }
        for i in &d.inbounds {
            if let Some(r) = &i.health.reason {
                why.push(format!("{}.{} {}: {}", d.mesh, d.name, i.port, r.message));
            }
        }
    }
    if !why.is_empty() {
        let _ = writeln!(out, "\nWhy:");
        for line in why {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

/// `yes`, `yes (on B)` when another instance holds the stream, or `no`.
fn connected(d: &DataplaneItem) -> String {
    match (&d.connection.held_by, d.connection.connected) {
        (Some(by), true) => format!("yes (on {by})"),
        (_, c) => yes_no(c),
    }
}

fn envoy(d: &DataplaneItem) -> String {
    d.connection
        .envoy_version
        .clone()
        .unwrap_or_else(|| "-".into())
}

pub(super) fn fmt_ip(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

pub(super) fn ago(t: Option<Timestamp>, now: Timestamp) -> String {
    match t {
        None => "never".into(),
        Some(t) => {
            let d = (now - t).to_std().unwrap_or_default();
            let secs = d.as_secs();
            if secs < 1 {
                format!("{}ms ago", d.as_millis())
            } else if secs < 120 {
                format!("{secs}s ago")
            } else {
                format!("{}m ago", secs / 60)
            }
        }
    }
}

/// How long until `t`: `in 3d 4h`, or `expired` once past.
pub(super) fn until(t: Timestamp, now: Timestamp) -> String {
    match (t - now).to_std() {
        Ok(d) if !d.is_zero() => {
            let secs = d.as_secs();
            let (days, hours, minutes) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60);
            match (days, hours) {
                (0, 0) => format!("in {minutes}m"),
                (0, h) => format!("in {h}h {minutes}m"),
                (d, h) => format!("in {d}d {h}h"),
            }
        }
        _ => "expired".to_string(),
    }
}

/// The dataplane files that fail to load, as the page's banner lists them
/// (`GET /api/v1/sources`); empty when none does.
fn render_broken_files(sources: &crate::api::SourcesView) -> String {
    let broken: Vec<_> = sources
        .files
        .iter()
        .filter_map(|f| Some((f, f.error.as_ref()?)))
        .collect();
    if broken.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\nBroken dataplane files ({}; each keeps its last good definitions; `hdsd validate` says more):\n",
        broken.len()
    );
    for (file, error) in broken {
        let _ = writeln!(
            out,
            "  {}{}: {}",
            file.path,
            error.line.map_or(String::new(), |l| format!(" line {l}")),
            error.message
        );
    }
    out
}

/// The dataplane files' warnings (fields ignored, inbounds in no service),
/// as the page's banner lists them; empty when there are none.
fn render_file_warnings(sources: &crate::api::SourcesView) -> String {
    let warnings: Vec<_> = sources
        .files
        .iter()
        .flat_map(|f| f.warnings.iter().map(move |w| (f, w)))
        .collect();
    if warnings.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\nDataplane file warnings ({}; the files load, `hdsd validate` lists them too):\n",
        warnings.len()
    );
    for (file, w) in warnings {
        let _ = writeln!(
            out,
            "  {}{}: {}",
            file.path,
            w.line.map_or(String::new(), |l| format!(" line {l}")),
            w.message
        );
    }
    out
}

/// `render`, the broken files, their warnings and [`render_zones`] at the
/// current time.
fn render_now(
    items: &[DataplaneItem],
    sources: Option<&crate::api::SourcesView>,
    zones: &ZonesAnswer,
) -> String {
    let now = SystemClock.now();
    render(items, now)
        + &sources.map(render_broken_files).unwrap_or_default()
        + &sources.map(render_file_warnings).unwrap_or_default()
        + &render_zones(zones, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_are_the_lists_query() {
        assert_eq!(Filter::default().path(), "/api/v1/dataplanes");
        let f = Filter {
            mesh: Some("shop".into()),
            service: Some("web_shop_svc_80".into()),
            zone: Some("eu-1".into()),
            not_ready: true,
            status: vec!["unhealthy".into(), "stale".into()],
        };
        assert_eq!(
            f.path(),
            "/api/v1/dataplanes?mesh=shop&service=web_shop_svc_80&zone=eu-1&ready=false&status=unhealthy,stale"
        );
        let odd = Filter {
            mesh: Some("a b&c".into()),
            ..Filter::default()
        };
        assert_eq!(odd.path(), "/api/v1/dataplanes?mesh=a%20b%26c");
    }

    /// Broken dataplane files are listed as the page's banner lists them.
    #[test]
    fn broken_files_are_listed_with_their_line_and_problem() {
        let sources: crate::api::SourcesView = serde_json::from_value(serde_json::json!({
            "dir": "./dataplanes", "errors": 1,
            "files": [
                {"path": "web.yaml", "dataplanes": ["default.web"], "error": null},
                {"path": "db.yaml", "dataplanes": [],
                 "error": {"line": 7, "message": "address \"db.local\" is not an IP literal"}}
            ]
        }))
        .unwrap();
        let text = render_broken_files(&sources);
        assert!(text.contains("Broken dataplane files (1;"), "{text}");
        assert!(
            text.contains("  db.yaml line 7: address \"db.local\" is not an IP literal"),
            "{text}"
        );
        assert!(!text.contains("web.yaml"), "{text}");
        let fine: crate::api::SourcesView =
            serde_json::from_value(serde_json::json!({"dir": "d", "errors": 0, "files": []}))
                .unwrap();
        assert_eq!(render_broken_files(&fine), "");
        assert_eq!(render_file_warnings(&fine), "");
    }

    /// Warnings are listed per file, with their line when known.
    #[test]
    fn file_warnings_are_listed_with_their_line() {
        let sources: crate::api::SourcesView = serde_json::from_value(serde_json::json!({
            "dir": "./dataplanes", "errors": 0, "warnings": 2,
            "files": [
                {"path": "web.yaml", "dataplanes": ["default.web"], "error": null,
                 "warnings": [
                     {"line": 9, "message": "document 1: unknown field networking.transparentProxying.redirectPort ignored"},
                     {"message": "dataplane default.web: networking.inbound[0] (port 1) has no kuma.io/service tag"}
                 ]},
                {"path": "db.yaml", "dataplanes": ["default.db"], "error": null}
            ]
        }))
        .unwrap();
        let text = render_file_warnings(&sources);
        assert!(text.contains("Dataplane file warnings (2;"), "{text}");
        assert!(
            text.contains("  web.yaml line 9: document 1: unknown field networking.transparentProxying.redirectPort ignored"),
            "{text}"
        );
        assert!(
            text.contains("  web.yaml: dataplane default.web: networking.inbound[0]"),
            "{text}"
        );
        assert!(!text.contains("db.yaml"), "{text}");
    }

    /// A global lists its zones; a zone shows its link and its problem;
    /// a standalone hdsd (or one too old to answer) shows nothing more.
    #[test]
    fn zones_are_listed_on_a_global_and_the_uplink_on_a_zone() {
        let now = chrono::Utc.timestamp_opt(1_700_000_100, 0).unwrap();
        let answer: ZonesAnswer = serde_json::from_value(serde_json::json!({
            "items": [
                {"name": "eu-1", "state": "online", "lastSeen": "2023-11-14T22:14:59Z",
                 "dataplanes": 2, "inbounds": {"ready": 1, "total": 2}, "withdrawn": false,
                 "registered": true, "streams": 1, "resumes": 0, "snapshots": 1},
                {"name": "us-1", "state": "offline", "lastSeen": "2023-11-14T22:12:00Z",
                 "dataplanes": 1, "inbounds": {"ready": 0, "total": 1}, "withdrawn": true}
            ]
        }))
        .unwrap();
        let text = render_zones(&answer, now);
        assert!(text.contains("Zones:"), "{text}");
        let eu = text.lines().find(|l| l.contains("eu-1")).unwrap();
        assert!(
            eu.contains("online") && eu.contains("1/2 inbounds ready"),
            "{eu}"
        );
        let us = text.lines().find(|l| l.contains("us-1")).unwrap();
        assert!(us.contains("offline") && us.contains("(withdrawn)"), "{us}");
        let zone: ZonesAnswer = serde_json::from_value(serde_json::json!({
            "items": [],
            "uplink": {"zone": "eu-1", "connected": false, "since": "2023-11-14T22:14:59Z",
                       "problem": "cannot connect to the global at http://g:5682", "accepted": 0}
        }))
        .unwrap();
        let text = render_zones(&zone, now);
        assert!(text.contains("Zone eu-1: not connected"), "{text}");
        assert!(text.contains("cannot connect to the global"), "{text}");
        assert_eq!(render_zones(&ZonesAnswer::default(), now), "");
        // A standby instance of a zone names the instance holding the uplink.
        let standby: ZonesAnswer = serde_json::from_value(serde_json::json!({
            "items": [],
            "uplink": {"zone": "eu-1", "state": "standby", "connected": false,
                       "holder": "zone-a/4242", "epoch": 7, "since": "2023-11-14T22:14:59Z",
                       "accepted": 0}
        }))
        .unwrap();
        let text = render_zones(&standby, now);
        assert!(
            text.contains(
                "Zone eu-1: standby (instance zone-a/4242 holds the uplink to the global)"
            ),
            "{text}"
        );
    }
    use crate::view::{ConnectionItem, HealthItem, InboundItem};
    use chrono::{TimeZone, Utc};

    #[test]
    fn table_has_a_line_per_inbound_and_a_summary() {
        let t0 = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let item = DataplaneItem {
            mesh: "default".into(),
            name: "web-01".into(),
            address: "127.0.0.1".parse().unwrap(),
            kind: DataplaneKind::Sidecar,
            connection: ConnectionItem {
                connected: true,
                connected_at: Some(t0),
                last_report_at: Some(t0),
                held_by: None,
                envoy_version: None,
                problem: None,
                token_expires_at: None,
            },
            inbounds: vec![inbound(
                10001,
                None,
                InboundState::Ready,
                "pending",
                false,
                t0,
            )],
            listeners: Vec::new(),
            zone: None,
        };
        let out = render(&[item], t0 + chrono::Duration::seconds(3));
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("DATAPLANE"));
        assert!(lines[1].contains("default.web-01"));
        assert!(lines[1].contains("web (127.0.0.1:8080)"));
        assert!(lines[1].contains("pending"));
        assert!(lines[1].contains("3s ago"));
        assert!(lines[1].contains("never"));
        assert!(out.contains("1 dataplanes (1 connected), 0/1 inbounds ready"));
    }

    fn inbound(
        port: u16,
        name: Option<&str>,
        state: InboundState,
        status: &str,
        ready: bool,
        t0: Timestamp,
    ) -> InboundItem {
        InboundItem {
            name: name.map(str::to_string),
            port,
            service_port: 8080,
            service_address: "127.0.0.1".parse().unwrap(),
            tags: [("kuma.io/service".to_string(), "web".to_string())].into(),
            state,
            operator_word: (state == InboundState::NotReady)
                .then_some(OperatorWord::DeclaredNotReady),
            health: HealthItem {
                ready,
                status: status.into(),
                since: t0,
                last_report_at: None,
                failing_reports: 0,
                last_healthy_at: None,
                changes: vec![],
                reason: None,
            },
            probe: None,
        }
    }

    #[test]
    fn names_states_gateways_and_zone_proxies() {
        let t0 = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let item = |name: &str, kind, inbounds, listeners| DataplaneItem {
            mesh: "default".into(),
            name: name.into(),
            address: "127.0.0.1".parse().unwrap(),
            kind,
            connection: ConnectionItem {
                connected: false,
                connected_at: None,
                last_report_at: None,
                held_by: None,
                envoy_version: None,
                problem: None,
                token_expires_at: None,
            },
            inbounds,
            listeners,
            zone: None,
        };
        let items = [
            item(
                "web-01",
                DataplaneKind::Sidecar,
                vec![
                    inbound(
                        21021,
                        Some("http-port"),
                        InboundState::Ready,
                        "healthy",
                        true,
                        t0,
                    ),
                    inbound(
                        21022,
                        Some("draining"),
                        InboundState::NotReady,
                        "healthy",
                        false,
                        t0,
                    ),
                    inbound(21023, None, InboundState::Ignored, "ignored", true, t0),
                ],
                Vec::new(),
            ),
            item("edge", DataplaneKind::Gateway, Vec::new(), Vec::new()),
            item(
                "zp",
                DataplaneKind::ZoneProxy,
                Vec::new(),
                vec![crate::dataplane::Listener {
                    kind: "ZoneIngress".into(),
                    port: 10001,
                    name: None,
                }],
            ),
        ];
        let out = render(&items, t0);
        let line = |needle: &str| {
            out.lines()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no line with {needle:?} in\n{out}"))
        };
        assert!(line("21021 (http-port)").contains("healthy"));
        assert!(line("21022 (draining)").contains("healthy (declared NotReady)"));
        assert!(line("21023").contains("ignored"));
        assert!(line("default.edge").contains("gateway"));
        assert!(line("default.edge").contains("nothing to probe"));
        assert!(line("default.zp").contains("zone proxy (ZoneIngress 10001)"));
        assert!(
            out.contains("3 dataplanes (0 connected), 1/2 inbounds ready (1 ignored)"),
            "{out}"
        );
    }

    #[test]
    fn names_the_holder_the_envoy_and_every_reason() {
        let t0 = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let mut grpc = inbound(10001, None, InboundState::Ready, "unsupported", false, t0);
        grpc.health.reason = Some(crate::view::ReasonItem {
            code: "envoy_too_old".into(),
            message: "gRPC probe needs Envoy >= 1.38; this Envoy is 1.37.0".into(),
        });
        let item = DataplaneItem {
            mesh: "default".into(),
            name: "cart".into(),
            address: "127.0.0.1".parse().unwrap(),
            kind: DataplaneKind::Sidecar,
            connection: ConnectionItem {
                connected: true,
                connected_at: Some(t0),
                last_report_at: Some(t0),
                held_by: Some("hdsd-b".into()),
                envoy_version: Some("1.37.0".into()),
                problem: Some(crate::view::ReasonItem {
                    code: "specifier_rejected".into(),
                    message: "Envoy ends the stream after every specifier".into(),
                }),
                token_expires_at: None,
            },
            inbounds: vec![grpc],
            listeners: Vec::new(),
            zone: None,
        };
        let out = render(&[item], t0);
        let row = out.lines().find(|l| l.contains("10001")).unwrap();
        assert!(row.contains("yes (on hdsd-b)"), "{out}");
        assert!(row.contains("1.37.0"), "{out}");
        assert!(row.contains("unsupported"), "{out}");
        assert!(
            out.contains(
                "default.cart 10001: gRPC probe needs Envoy >= 1.38; this Envoy is 1.37.0"
            ),
            "{out}"
        );
        assert!(
            out.contains("default.cart: Envoy ends the stream after every specifier"),
            "{out}"
        );
    }

    /// A TLS probe is marked beside its target; a failing one says why.
    #[test]
    fn a_tls_probe_is_marked_and_its_failure_explained() {
        let t0 = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let mut web = inbound(10001, None, InboundState::Ready, "unhealthy", false, t0);
        web.probe = Some(crate::view::ProbeItem {
            kind: "http".into(),
            fallback: None,
            cluster: "probe_127.0.0.1:8443".into(),
            target: "127.0.0.1:8443".parse().unwrap(),
            interval: std::time::Duration::from_secs(1),
            timeout: std::time::Duration::from_secs(1),
            no_traffic_interval: std::time::Duration::from_secs(1),
            healthy_threshold: 1,
            unhealthy_threshold: 2,
            tls: Some(crate::view::TlsItem {
                verify: "ca".into(),
                ca_file: Some("/etc/envoy/ca.pem".into()),
                sni: None,
                client_cert_file: None,
                alpn: Vec::new(),
            }),
        });
        web.health.reason = Some(crate::view::tls_failing("probe_127.0.0.1:8443"));
        let mut plain = inbound(10002, None, InboundState::Ready, "healthy", true, t0);
        plain.service_port = 8081;
        let item = DataplaneItem {
            mesh: "default".into(),
            name: "web".into(),
            address: "127.0.0.1".parse().unwrap(),
            kind: DataplaneKind::Sidecar,
            connection: ConnectionItem {
                connected: true,
                connected_at: Some(t0),
                last_report_at: Some(t0),
                held_by: None,
                envoy_version: None,
                problem: None,
                token_expires_at: None,
            },
            inbounds: vec![web, plain],
            listeners: Vec::new(),
            zone: None,
        };
        let out = render(&[item], t0);
        let row = |port: &str| out.lines().find(|l| l.contains(port)).unwrap().to_string();
        assert!(row("10001").contains(", TLS)"), "{out}");
        assert!(!row("10002").contains("TLS"), "{out}");
        assert!(
            out.contains("default.web 10001: the probe runs over TLS and Envoy reports it failing"),
            "{out}"
        );
        assert!(out.contains("cluster.probe_127.0.0.1_8443."), "{out}");
    }
}
