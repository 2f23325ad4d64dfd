//! `hdsd explain MESH NAME`: one dataplane whole, read from the REST API
//! (a zone's at a global with `--zone`): for each inbound what is checked,
//! by which Envoy, the last reports and why it is not ready. The renderer
//! is a plain function of the API's item and the time.

use std::fmt::Write as _;
use std::process::ExitCode;

use super::http::{encode, Api};
use super::status::{ago, fmt_ip, until};
use super::ApiArgs;
use crate::clock::{Clock as _, SystemClock};
use crate::dataplane::InboundState;
use crate::readiness::Timestamp;
use crate::view::DataplaneItem;

/// `hdsd explain`'s arguments.
#[derive(clap::Args)]
pub(super) struct ExplainArgs {
    /// The dataplane's mesh.
    mesh: String,
    /// The dataplane's name.
    name: String,
    /// On a global: the zone the dataplane belongs to.
    #[arg(long)]
    zone: Option<String>,
    #[command(flatten)]
    pub(super) api: ApiArgs,
    /// Print the dataplane's API item as JSON instead.
    #[arg(long)]
    json: bool,
}

impl ExplainArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let path = dataplane_path(&self.mesh, &self.name, self.zone.as_deref());
        let item: DataplaneItem = Api::connect(self.api)?.get_json(&path)?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&item)?);
        } else {
            print!("{}", render_explain(&item, SystemClock.now()));
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// `hdsd explain`: one dataplane, every inbound with what is checked, by
/// which Envoy, the last reports and why it is not ready.
fn render_explain(d: &DataplaneItem, now: Timestamp) -> String {
    let mut out = String::new();
    let counted: Vec<_> = d
        .inbounds
        .iter()
        .filter(|i| i.state != InboundState::Ignored)
        .collect();
    let ready = counted.iter().filter(|i| i.health.ready).count();
    let _ = write!(
        out,
        "{}.{}: {} ({ready}/{} inbounds ready)",
        d.mesh,
        d.name,
        if ready == counted.len() {
            "READY"
        } else {
            "NOT READY"
        },
        counted.len()
    );
    match &d.zone {
        Some(z) => {
            let _ = writeln!(out, ", zone {} ({})", z.name, z.state);
        }
        None => out.push('\n'),
    }
    let c = &d.connection;
    let _ = writeln!(
        out,
        "Envoy: {}{}{}; last report {}",
        match (c.connected, &c.held_by) {
            (true, Some(by)) => format!("connected to instance {by}"),
            (true, None) => "connected".to_string(),
            (false, _) => "not connected".to_string(),
        },
        c.connected_at
            .filter(|_| c.connected)
            .map_or(String::new(), |t| format!(
                " since {} ({})",
                t.to_rfc3339(),
                ago(Some(t), now)
            )),
        c.envoy_version
            .as_ref()
            .map_or(String::new(), |v| format!(", version {v}")),
        ago(c.last_report_at, now),
    );
    if let Some(at) = c.token_expires_at {
        let _ = writeln!(
            out,
            "  token expires at {} ({})",
            at.to_rfc3339(),
            until(at, now)
        );
    }
    if let Some(p) = &c.problem {
        let _ = writeln!(out, "  problem ({}): {}", p.code, p.message);
    }
    for i in &d.inbounds {
        let h = &i.health;
        let service = i
            .tags
            .get("kuma.io/service")
            .map_or(String::new(), |s| format!(" service {s},"));
        let _ = writeln!(
            out,
            "\ninbound {}{service} app {}:{}: {}, {} since {} ({})",
            i.port,
            fmt_ip(i.service_address),
            i.service_port,
            if h.ready { "ready" } else { "NOT READY" },
            h.status,
            h.since.to_rfc3339(),
            ago(Some(h.since), now),
        );
        match &i.probe {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "  checked: {}{} of {} every {}, timeout {}, unhealthy after {} failure(s), healthy after {} success(es){}",
                    p.kind,
                    p.fallback
                        .as_ref()
                        .map_or(String::new(), |f| format!(" (run as {f}: this Envoy cannot run {})", p.kind)),
                    p.target,
                    humantime::format_duration(p.interval),
                    humantime::format_duration(p.timeout),
                    p.unhealthy_threshold,
                    p.healthy_threshold,
                    p.tls.as_ref().map_or(String::new(), |t| format!(
                        ", over TLS (verify {}{})",
                        t.verify,
                        t.sni.as_ref().map_or(String::new(), |s| format!(", SNI {s}"))
                    )),
                );
                let _ = writeln!(out, "  Envoy cluster: {}", p.cluster);
            }
            None if i.state == InboundState::Ignored => {
                let _ = writeln!(out, "  not checked: state Ignored");
            }
            None => {
                let _ = writeln!(out, "  not checked by any probe");
            }
        }
        let _ = writeln!(
            out,
            "  reports: last {}{}{}",
            ago(h.last_report_at, now),
            match h.failing_reports {
                0 => String::new(),
                n => format!(", {n} failing in a row"),
            },
            h.last_healthy_at.map_or(String::new(), |t| format!(
                ", last healthy {}",
                ago(Some(t), now)
            )),
        );
        if let Some(r) = &h.reason {
            let _ = writeln!(out, "  why ({}): {}", r.code, r.message);
        }
        if !h.changes.is_empty() {
            let _ = writeln!(out, "  recent changes:");
            for change in &h.changes {
                let _ = writeln!(
                    out,
                    "    {} -> {} at {} ({})",
                    change.from,
                    change.to,
                    change.at.to_rfc3339(),
                    ago(Some(change.at), now)
                );
            }
        }
    }
    out
}

/// The API path of one dataplane: the instance's own, or a zone's at a
/// global.
fn dataplane_path(mesh: &str, name: &str, zone: Option<&str>) -> String {
    match zone.filter(|z| *z != crate::names::RESERVED_ZONE) {
        Some(zone) => format!(
            "/api/v1/zones/{}/dataplanes/{}/{}",
            encode(zone),
            encode(mesh),
            encode(name)
        ),
        None => format!("/api/v1/dataplanes/{}/{}", encode(mesh), encode(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;

    /// `hdsd explain` says for each inbound what is checked, by which
    /// Envoy, the last reports, why it is not ready and its recent changes.
    #[test]
    fn explain_tells_what_is_checked_and_why_it_is_not_ready() {
        let now = chrono::Utc.timestamp_opt(1_700_000_100, 0).unwrap();
        let item: DataplaneItem = serde_json::from_value(serde_json::json!({
            "mesh": "shop", "name": "web-01", "address": "10.0.0.5",
            "connection": {"connected": true, "connectedAt": "2023-11-14T22:13:00Z",
                           "lastReportAt": "2023-11-14T22:14:58Z", "envoyVersion": "1.38.2",
                           "heldBy": "hdsd-b/77", "tokenExpiresAt": "2023-11-17T23:15:00Z"},
            "inbounds": [
                {"port": 10001, "servicePort": 8080, "serviceAddress": "127.0.0.1",
                 "tags": {"kuma.io/service": "web"},
                 "health": {"ready": false, "status": "unhealthy", "since": "2023-11-14T22:14:00Z",
                            "lastReportAt": "2023-11-14T22:14:58Z", "failingReports": 4,
                            "lastHealthyAt": "2023-11-14T22:13:50Z",
                            "changes": [{"from": "healthy", "to": "unhealthy", "at": "2023-11-14T22:14:00Z"}],
                            "reason": {"code": "probe_failing", "message": "Envoy shop.web-01 reports the http check failing"}},
                 "probe": {"kind": "http", "cluster": "probe_127.0.0.1:8080", "target": "127.0.0.1:8080",
                           "interval": "2s", "timeout": "1s", "noTrafficInterval": "2s",
                           "healthyThreshold": 1, "unhealthyThreshold": 3,
                           "tls": {"verify": "ca", "sni": "web.internal"}}},
                {"port": 10002, "servicePort": 9090, "serviceAddress": "127.0.0.1", "tags": {},
                 "state": "Ignored",
                 "health": {"ready": true, "status": "ignored", "since": "2023-11-14T22:13:00Z"}}
            ],
            "zone": {"name": "eu-1", "state": "online"}
        }))
        .unwrap();
        let text = render_explain(&item, now);
        for part in [
            "shop.web-01: NOT READY (0/1 inbounds ready), zone eu-1 (online)",
            "Envoy: connected to instance hdsd-b/77 since 2023-11-14T22:13:00+00:00 (2m ago), version 1.38.2; last report 2s ago",
            "inbound 10001 service web, app 127.0.0.1:8080: NOT READY, unhealthy since",
            "checked: http of 127.0.0.1:8080 every 2s, timeout 1s, unhealthy after 3 failure(s), healthy after 1 success(es), over TLS (verify ca, SNI web.internal)",
            "reports: last 2s ago, 4 failing in a row, last healthy 70s ago",
            "token expires at 2023-11-17T23:15:00+00:00 (in 3d 1h)",
            "why (probe_failing): Envoy shop.web-01 reports the http check failing",
            "healthy -> unhealthy at 2023-11-14T22:14:00+00:00 (60s ago)",
            "inbound 10002 app 127.0.0.1:9090: ready, ignored",
            "not checked: state Ignored",
        ] {
            assert!(text.contains(part), "{part}\n---\n{text}");
        }
        assert_eq!(
            dataplane_path("shop", "web 01", None),
            "/api/v1/dataplanes/shop/web%2001"
        );
        assert_eq!(
            dataplane_path("shop", "web-01", Some("eu-1")),
            "/api/v1/zones/eu-1/dataplanes/shop/web-01"
        );
        assert_eq!(
            dataplane_path("shop", "web-01", Some("local")),
            "/api/v1/dataplanes/shop/web-01"
        );
    }
}
