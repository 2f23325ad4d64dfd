//! The `/metrics` scrape: the fleet gauges (dataplanes by connection, inbounds
//! by readiness status, failing dataplane files) counted from the registry's
//! and the source's snapshots when Prometheus scrapes, then every metric
//! rendered, then, on a global, the zone series rendered from the hub's
//! view (so a deleted zone's series go with it). It reads state and sets
//! gauges of the metrics recorder only.

use std::sync::Arc;

use metrics::gauge;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::clock::{Clock as _, SystemClock};
use crate::metrics::{
    DATAPLANES, DATAPLANES_REJECTING, INBOUNDS, SOURCE_ERRORS, TOKEN_EARLIEST_EXPIRY,
};
use crate::readiness::Status;
use crate::registry::Registry;
use crate::sources::Loaded;
use crate::view::zones::{ZoneState, ZonesView};

/// Renders `/metrics`: refreshes the fleet gauges and process metrics from
/// snapshots, then renders every metric.
#[derive(Clone)]
pub struct Scrape {
    pub handle: PrometheusHandle,
    pub registry: Registry,
    pub sources: tokio::sync::watch::Receiver<Arc<Loaded>>,
    pub process: Arc<metrics_process::Collector>,
    /// On a global: the hub's view of its zones.
    pub zones: Option<tokio::sync::watch::Receiver<Arc<ZonesView>>>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape").finish_non_exhaustive()
    }
}

impl Scrape {
    pub fn render(&self) -> String {
        let mut connected = 0u64;
        let mut disconnected = 0u64;
        let mut by_status = [0u64; Status::ALL.len()];
        let mut rejecting = 0u64;
        let mut earliest: Option<crate::clock::Timestamp> = None;
        for handle in self.registry.catalog().values() {
            let state = handle.subscribe();
            let state = state.borrow();
            if state.defined.is_none() {
                continue;
            }
            if state.connection.stream.is_some() {
                connected += 1;
                if let Some(at) = state.connection.token_expires_at {
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            } else {
                disconnected += 1;
            }
            if state.envoy.rejects_specifier() {
                rejecting += 1;
            }
            for inbound in &state.health.inbounds {
                if let Some(i) = Status::ALL.iter().position(|s| *s == inbound.status) {
                    by_status[i] += 1;
                }
            }
        }
        gauge!(DATAPLANES, "connected" => "true").set(connected as f64);
        gauge!(DATAPLANES, "connected" => "false").set(disconnected as f64);
        for (status, n) in Status::ALL.iter().zip(by_status) {
            gauge!(INBOUNDS, "status" => status.as_str()).set(n as f64);
        }
        gauge!(DATAPLANES_REJECTING).set(rejecting as f64);
        gauge!(TOKEN_EARLIEST_EXPIRY).set(earliest.map_or(f64::INFINITY, |at| {
            (at - SystemClock.now()).num_milliseconds().max(0) as f64 / 1000.0
        }));
        gauge!(SOURCE_ERRORS).set(self.sources.borrow().error_count() as f64);
        self.process.collect();
        let mut out = self.handle.render();
        if let Some(zones) = &self.zones {
            let view = zones.borrow().clone();
            let states = ZoneState::ALL.map(ZoneState::as_str);
            let zones: Vec<crate::metrics::ZoneMetrics<'_>> = view
                .zones
                .iter()
                .map(|z| {
                    let s = &z.summary;
                    crate::metrics::ZoneMetrics {
                        zone: &s.name,
                        state: s.liveness.state.as_str(),
                        last_seen_unix: s.liveness.last_seen.map(|t| t.timestamp() as f64),
                        dataplanes: s.dataplanes as u64,
                        inbounds_ready: s.inbounds_ready as u64,
                        inbounds_total: s.inbounds_total as u64,
                        streams: s.counters.streams,
                        resumes: s.counters.resumes,
                        snapshots: s.counters.snapshots,
                    }
                })
                .collect();
            crate::metrics::render_zones(&zones, &states, &mut out);
        }
        out
    }
}
