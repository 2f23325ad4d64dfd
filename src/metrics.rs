//! Prometheus metrics: names, descriptions, buckets, and the recorder.
//!
//! Counters and histograms are recorded where things happen; gauges that
//! describe the fleet (dataplanes, inbounds by status, failing files) are
//! computed from snapshots at scrape time by [`crate::scrape`], so they can
//! never drift. No label carries a dataplane or inbound name: cardinality is
//! bounded.
//!
//! This module depends on no other module of hdsd: callers pass plain numbers.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const STREAMS_ACTIVE: &str = "hdsd_streams_active";
pub const STREAMS_CLOSED: &str = "hdsd_streams_closed_total";
pub const HEALTH_CHECK_REQUESTS: &str = "hdsd_health_check_requests_total";
pub const REPORTS: &str = "hdsd_reports_total";
pub const REPORT_PROCESSING: &str = "hdsd_report_processing_seconds";
pub const REPORT_UNKNOWN_ENDPOINTS: &str = "hdsd_report_unknown_endpoints_total";
pub const SPECIFIERS_SENT: &str = "hdsd_specifiers_sent_total";
pub const SPECIFIER_GENERATION: &str = "hdsd_specifier_generation_seconds";
pub const SPECIFIER_GENERATION_ERRORS: &str = "hdsd_specifier_generation_errors_total";
pub const DATAPLANES: &str = "hdsd_dataplanes";
pub const INBOUNDS: &str = "hdsd_inbounds";
pub const READINESS_TRANSITIONS: &str = "hdsd_readiness_transitions_total";
pub const AUTH_FAILURES: &str = "hdsd_auth_failures_total";
pub const SOURCE_ERRORS: &str = "hdsd_dataplane_source_errors";
pub const FILE_LIMIT_HITS: &str = "hdsd_dataplane_file_limit_hits_total";
pub const DOCUMENT_CACHE_BYTES: &str = "hdsd_dataplane_document_cache_bytes";
pub const DOCUMENT_CACHE_DOCUMENTS: &str = "hdsd_dataplane_document_cache_documents";
pub const BUILD_INFO: &str = "hdsd_build_info";
pub const STREAMS_WAITING: &str = "hdsd_streams_waiting";
pub const AUTH_SIGNING_KEYS: &str = "hdsd_auth_signing_keys";
pub const STORE_COMMITS: &str = "hdsd_store_commits_total";
pub const STORE_WRITE_FAILURES: &str = "hdsd_store_write_failures_total";
pub const STORE_PENDING_WRITES: &str = "hdsd_store_pending_writes";
pub const STORE_UP: &str = "hdsd_store_up";
pub const FEED_CHANGES: &str = "hdsd_feed_changes_total";
pub const WATCHERS_ACTIVE: &str = "hdsd_watchers_active";
pub const WATCH_EVENTS_SENT: &str = "hdsd_watch_events_sent_total";
pub const WATCH_RESYNCS: &str = "hdsd_watch_resyncs_total";
pub const EDS_STREAMS_ACTIVE: &str = "hdsd_eds_streams_active";
pub const EDS_PUSHES: &str = "hdsd_eds_pushes_total";
pub const EDS_NACKS: &str = "hdsd_eds_nacks_total";
pub const EDS_ENDPOINTS: &str = "hdsd_eds_endpoints";
pub const EDS_DUPLICATE_ADDRESSES: &str = "hdsd_eds_duplicate_addresses";
pub const EDS_REFRESHES: &str = "hdsd_eds_refreshes_total";
pub const CONNECTIONS_OPEN: &str = "hdsd_connections_open";
pub const CONNECTIONS_REFUSED: &str = "hdsd_connections_refused_total";
pub const CONNECTIONS_TIMED_OUT: &str = "hdsd_connections_timed_out_total";
pub const CONNECTIONS_EVICTED: &str = "hdsd_connections_evicted_total";
pub const ACCEPT_ERRORS: &str = "hdsd_accept_errors_total";
pub const LIMIT_HITS: &str = "hdsd_limit_hits_total";
pub const CLIENT_BYTES: &str = "hdsd_client_bytes";
pub const AUTH_RELOADS: &str = "hdsd_auth_reloads_total";
pub const SPECIFIER_REJECTIONS: &str = "hdsd_specifier_rejections_total";
pub const DATAPLANES_REJECTING: &str = "hdsd_dataplanes_rejecting_specifier";
pub const TOKEN_EARLIEST_EXPIRY: &str = "hdsd_token_earliest_expiry_seconds";
pub const UNSUPPORTED_PROBES: &str = "hdsd_unsupported_probes_total";
pub const ZONES: &str = "hdsd_zones";
pub const ZONE_STATE: &str = "hdsd_zone_state";
pub const ZONE_LAST_SEEN: &str = "hdsd_zone_last_seen_timestamp_seconds";
pub const ZONE_DATAPLANES: &str = "hdsd_zone_dataplanes";
pub const ZONE_INBOUNDS: &str = "hdsd_zone_inbounds";
pub const ZONE_STREAMS: &str = "hdsd_zone_streams_total";
pub const ZONE_RESUMES: &str = "hdsd_zone_resumes_total";
pub const ZONE_SNAPSHOTS: &str = "hdsd_zone_snapshots_total";
pub const ZONE_REFUSALS: &str = "hdsd_zone_refusals_total";
/// API requests refused before any handler for what a browser could do
/// for another site, by `reason` (`host`, `origin`, `content_type`).
pub const API_BROWSER_REFUSALS: &str = "hdsd_api_browser_refusals_total";
pub const UPLINK_CONNECTED: &str = "hdsd_uplink_connected";
pub const UPLINK_DISCONNECTS: &str = "hdsd_uplink_disconnects_total";
pub const UPLINK_STATE: &str = "hdsd_uplink_state";
pub const UPLINK_SYNC_LAG: &str = "hdsd_uplink_sync_lag_seconds";
pub const READINESS_FOLLOW: &str = "hdsd_readiness_follow_seconds";
pub const READINESS_FOLLOWED_ROWS: &str = "hdsd_readiness_followed_rows_total";

/// The listeners, the `listener` label of the connection metrics.
pub const LISTENERS: [&str; 3] = ["hds", "api", "zones"];

/// The limits of HDS streams and reports, the `limit` label of
/// `hdsd_limit_hits_total`.
pub const STREAM_LIMITS: [&str; 9] = [
    "first_request_timeout",
    "max_streams_per_dataplane",
    "max_waiting_streams",
    "max_message_bytes",
    "max_report_endpoints",
    "max_eds_resource_names",
    "max_watches",
    "max_watch_names",
    "client_bytes",
];

/// Counts one admitted connection (`hdsd_connections_open`).
pub fn connection_opened(listener: &'static str) {
    gauge!(CONNECTIONS_OPEN, "listener" => listener).increment(1.0);
}

/// Counts one admitted connection closed.
pub fn connection_closed(listener: &'static str) {
    gauge!(CONNECTIONS_OPEN, "listener" => listener).decrement(1.0);
}

/// Counts a connection refused at accept (`reason`: the cap reached).
pub fn connection_refused(listener: &'static str, reason: &'static str) {
    counter!(CONNECTIONS_REFUSED, "listener" => listener, "reason" => reason).increment(1);
}

/// Counts a connection closed to admit a newcomer (`reason`: the cap reached).
pub fn connection_evicted(listener: &'static str, reason: &'static str) {
    counter!(CONNECTIONS_EVICTED, "listener" => listener, "reason" => reason).increment(1);
}

/// Counts a connection closed by a deadline (`phase`: handshake,
/// unauthenticated, idle or body).
pub fn connection_timed_out(listener: &'static str, phase: &'static str) {
    counter!(CONNECTIONS_TIMED_OUT, "listener" => listener, "phase" => phase).increment(1);
}

/// Counts a failed accept (`kind`: out_of_file_descriptors or other).
pub fn accept_error(listener: &'static str, kind: &'static str) {
    counter!(ACCEPT_ERRORS, "listener" => listener, "kind" => kind).increment(1);
}

/// The memory budget for clients: bytes held now and the limit.
pub fn client_bytes(used: usize, limit: usize) {
    gauge!(CLIENT_BYTES, "state" => "held").set(used as f64);
    gauge!(CLIENT_BYTES, "state" => "limit").set(limit as f64);
}

/// Counts a stream or report stopped by one of [`STREAM_LIMITS`].
pub fn limit_hit(limit: &'static str) {
    counter!(LIMIT_HITS, "limit" => limit).increment(1);
}

/// Why a stream ended: the `reason` label of `hdsd_streams_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    Ok,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    Invalid,
    Stale,
    Replaced,
    Shutdown,
    Error,
}

impl CloseReason {
    pub const ALL: [CloseReason; 9] = [
        CloseReason::Ok,
        CloseReason::Unauthenticated,
        CloseReason::PermissionDenied,
        CloseReason::NotFound,
        CloseReason::Invalid,
        CloseReason::Stale,
        CloseReason::Replaced,
        CloseReason::Shutdown,
        CloseReason::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Ok => "ok",
            CloseReason::Unauthenticated => "unauthenticated",
            CloseReason::PermissionDenied => "permission_denied",
            CloseReason::NotFound => "not_found",
            CloseReason::Invalid => "invalid",
            CloseReason::Stale => "stale",
            CloseReason::Replaced => "replaced",
            CloseReason::Shutdown => "shutdown",
            CloseReason::Error => "error",
        }
    }
}

pub fn stream_closed(reason: CloseReason) {
    counter!(STREAMS_CLOSED, "reason" => reason.as_str()).increment(1);
}

/// Keeps `hdsd_streams_active` right on every exit path.
#[derive(Debug)]
pub struct ActiveStream(());

impl ActiveStream {
    pub fn new() -> Self {
        gauge!(STREAMS_ACTIVE).increment(1.0);
        ActiveStream(())
    }
}

impl Default for ActiveStream {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        gauge!(STREAMS_ACTIVE).decrement(1.0);
    }
}

/// Keeps `hdsd_streams_waiting` right: a stream waiting for its dataplane
/// to be defined (unknown, or deleted and within the grace).
#[derive(Debug)]
pub struct WaitingStream(());

impl WaitingStream {
    pub fn new() -> Self {
        gauge!(STREAMS_WAITING).increment(1.0);
        WaitingStream(())
    }
}

impl Default for WaitingStream {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for WaitingStream {
    fn drop(&mut self) {
        gauge!(STREAMS_WAITING).decrement(1.0);
    }
}

/// Handles of the metrics touched on every message, looked up once instead
/// of in the registry per report.
#[derive(Debug)]
pub struct Hot {
    pub health_check_requests: metrics::Counter,
    pub reports: metrics::Counter,
    pub report_processing: metrics::Histogram,
    pub report_unknown_endpoints: metrics::Counter,
    pub specifiers_sent: metrics::Counter,
    pub became_ready: metrics::Counter,
    pub became_not_ready: metrics::Counter,
}

static HOT: std::sync::OnceLock<Hot> = std::sync::OnceLock::new();

/// The hot-path handles. Registered by [`install`]; before it (unit tests
/// without a recorder) they record nothing.
pub fn hot() -> &'static Hot {
    HOT.get_or_init(|| Hot {
        health_check_requests: counter!(HEALTH_CHECK_REQUESTS),
        reports: counter!(REPORTS),
        report_processing: metrics::histogram!(REPORT_PROCESSING),
        report_unknown_endpoints: counter!(REPORT_UNKNOWN_ENDPOINTS),
        specifiers_sent: counter!(SPECIFIERS_SENT),
        became_ready: counter!(READINESS_TRANSITIONS, "to" => "ready"),
        became_not_ready: counter!(READINESS_TRANSITIONS, "to" => "not_ready"),
    })
}

/// Records one folded report: how long folding took and how many of its
/// endpoints the current specifier does not have.
pub fn report_folded(took: std::time::Duration, unknown_endpoints: u32) {
    let hot = hot();
    hot.report_processing.record(took.as_secs_f64());
    if unknown_endpoints > 0 {
        hot.report_unknown_endpoints
            .increment(u64::from(unknown_endpoints));
    }
}

/// Counts inbounds that became ready or not ready.
pub fn transitions(became_ready: u32, became_not_ready: u32) {
    if became_ready > 0 {
        hot().became_ready.increment(u64::from(became_ready));
    }
    if became_not_ready > 0 {
        hot()
            .became_not_ready
            .increment(u64::from(became_not_ready));
    }
}

/// Counts a dataplane whose Envoy began ending the stream after every
/// specifier (once per episode: a report ends it).
pub fn specifier_rejected() {
    counter!(SPECIFIER_REJECTIONS).increment(1);
}

/// Counts probe targets left out of (or replaced in) an Envoy's specifier
/// because its version cannot run them; `fallback`: a TCP connect replaced it.
pub fn unsupported_probes(n: usize, fallback: bool) {
    let how = if fallback { "fallback" } else { "left_out" };
    counter!(UNSUPPORTED_PROBES, "how" => how).increment(n as u64);
}

/// Records one specifier build.
pub fn specifier_built(ok: bool, took: std::time::Duration) {
    metrics::histogram!(SPECIFIER_GENERATION).record(took.as_secs_f64());
    if !ok {
        counter!(SPECIFIER_GENERATION_ERRORS).increment(1);
    }
}

/// What the dataplane files' kept parses hold: bytes and documents.
pub fn document_cache(bytes: u64, documents: usize) {
    gauge!(DOCUMENT_CACHE_BYTES).set(bytes as f64);
    gauge!(DOCUMENT_CACHE_DOCUMENTS).set(documents as f64);
}

/// Counts a dataplane file rejected for going past a limit (`limit`: see
/// `dataplane::Limit::as_str`), once per rejection the log reports.
pub fn dataplane_file_limit_hit(limit: &'static str) {
    counter!(FILE_LIMIT_HITS, "limit" => limit).increment(1);
}

/// Counts changes the feed numbered (one revision each).
pub fn feed_changes(n: usize) {
    counter!(FEED_CHANGES).increment(n as u64);
}

/// Counts one message handed to a watcher (gRPC Watch or SSE).
pub fn watch_event_sent() {
    counter!(WATCH_EVENTS_SENT).increment(1);
}

/// Counts one RESYNC told to a watcher.
pub fn watch_resync(reason: &'static str) {
    counter!(WATCH_RESYNCS, "reason" => reason).increment(1);
}

/// One zone as the global sees it, for [`render_zones`].
#[derive(Debug, Clone, Copy)]
pub struct ZoneMetrics<'a> {
    pub zone: &'a str,
    /// The zone's state word.
    pub state: &'a str,
    /// The last sign of life, Unix seconds.
    pub last_seen_unix: Option<f64>,
    pub dataplanes: u64,
    pub inbounds_ready: u64,
    pub inbounds_total: u64,
    pub streams: u64,
    pub resumes: u64,
    pub snapshots: u64,
}

/// The zone families rendered at scrape time: name, type, description.
const ZONE_FAMILIES: [(&str, &str, &str); 8] = [
    (
        ZONES,
        "gauge",
        "Zones a global knows, by state (never_connected, online, offline, disabled).",
    ),
    (
        ZONE_STATE,
        "gauge",
        "1 for the zone's state at this global (online: a message within global.zone_timeout; offline; disabled; never_connected), 0 for the others.",
    ),
    (
        ZONE_LAST_SEEN,
        "gauge",
        "When the global last heard from the zone (Unix time, the global's clock).",
    ),
    (ZONE_DATAPLANES, "gauge", "Dataplanes the global holds of the zone."),
    (
        ZONE_INBOUNDS,
        "gauge",
        "Inbounds the global holds of the zone, by readiness (a withdrawn zone's read not ready).",
    ),
    (ZONE_STREAMS, "counter", "Streams of the zone that won its uplink."),
    (
        ZONE_RESUMES,
        "counter",
        "Streams of the zone that won its uplink while the global held the zone complete, so it could resume after that revision (a zone that cannot, e.g. after a restart, sends a snapshot anyway).",
    ),
    (ZONE_SNAPSHOTS, "counter", "Snapshots of the zone completed."),
];

/// A label value as the exposition format writes it.
fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Appends the zone series of a global to a scrape (Prometheus text
/// format): `hdsd_zones{state}` over `states`, and each zone's
/// `hdsd_zone_*{zone}`. They are rendered from the hub's view at every
/// scrape rather than kept in the recorder, so a deleted zone's series go
/// with it (the recorder has no way to remove a series) and they cannot
/// drift from `/api/v1/zones`.
pub fn render_zones(zones: &[ZoneMetrics<'_>], states: &[&str], out: &mut String) {
    use std::fmt::Write as _;
    for (name, kind, help) in ZONE_FAMILIES {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        if name == ZONES {
            for state in states {
                let n = zones.iter().filter(|z| z.state == *state).count();
                let _ = writeln!(out, "{name}{{state=\"{}\"}} {n}", label_value(state));
            }
            continue;
        }
        for z in zones {
            let zone = label_value(z.zone);
            let mut line = |labels: &str, value: f64| {
                let _ = writeln!(out, "{name}{{zone=\"{zone}\"{labels}}} {value}");
            };
            match name {
                ZONE_STATE => {
                    for state in states {
                        let on = if *state == z.state { 1.0 } else { 0.0 };
                        line(&format!(",state=\"{}\"", label_value(state)), on);
                    }
                }
                ZONE_LAST_SEEN => {
                    if let Some(t) = z.last_seen_unix {
                        line("", t);
                    }
                }
                ZONE_DATAPLANES => line("", z.dataplanes as f64),
                ZONE_INBOUNDS => {
                    line(",ready=\"true\"", z.inbounds_ready as f64);
                    line(
                        ",ready=\"false\"",
                        z.inbounds_total.saturating_sub(z.inbounds_ready) as f64,
                    );
                }
                ZONE_STREAMS => line("", z.streams as f64),
                ZONE_RESUMES => line("", z.resumes as f64),
                _ => line("", z.snapshots as f64),
            }
        }
    }
}

/// An API request refused by the browser rules, by `reason`.
pub fn api_refused(reason: &'static str) {
    counter!(API_BROWSER_REFUSALS, "reason" => reason).increment(1);
}

/// A zone stream refused or ended by the global, by its stable code.
pub fn zone_refused(code: &str) {
    counter!(ZONE_REFUSALS, "code" => code.to_string()).increment(1);
}

pub fn uplink_connected(connected: bool) {
    gauge!(UPLINK_CONNECTED).set(if connected { 1.0 } else { 0.0 });
}

/// At a zone: 1 for the uplink's `state` now, 0 for the others.
pub fn uplink_state(state: &'static str, current: bool) {
    gauge!(UPLINK_STATE, "state" => state).set(if current { 1.0 } else { 0.0 });
}

/// At a zone: changes the global acknowledged, each one's time from being
/// sent to its acknowledgement.
pub fn uplink_sync_lags(lags: &[std::time::Duration]) {
    let h = metrics::histogram!(UPLINK_SYNC_LAG);
    for lag in lags {
        h.record(lag.as_secs_f64());
    }
}

/// With a shared store: one read of the readiness other instances wrote,
/// from the query to every row applied (`check`: the periodic check of
/// every row's sequence number, else a read of the rows written since the
/// last), and the rows it handed on.
pub fn readiness_followed(check: bool, rows: usize, took: std::time::Duration) {
    let read = if check { "check" } else { "changes" };
    metrics::histogram!(READINESS_FOLLOW, "read" => read).record(took.as_secs_f64());
    counter!(READINESS_FOLLOWED_ROWS, "read" => read).increment(rows as u64);
}

/// The zone's stream to the global ended, by its stable code.
pub fn uplink_ended(code: &str) {
    counter!(UPLINK_DISCONNECTS, "code" => code.to_string()).increment(1);
}

/// Makes a series of every label value known before anything happens (a
/// counter at 0), so dashboards and alerts see them from the start. The
/// owner of each label's values calls it where it starts: metrics knows
/// no type of hdsd's.
pub fn zero_counters(name: &'static str, label: &'static str, values: &[&'static str]) {
    for &value in values {
        counter!(name, label => value).absolute(0);
    }
}

/// [`zero_counters`] for a gauge.
pub fn zero_gauges(name: &'static str, label: &'static str, values: &[&'static str]) {
    for &value in values {
        gauge!(name, label => value).set(0.0);
    }
}

/// Keeps `hdsd_watchers_active` right on every exit path.
#[derive(Debug)]
pub struct ActiveWatcher(());

impl ActiveWatcher {
    pub fn new() -> Self {
        gauge!(WATCHERS_ACTIVE).increment(1.0);
        ActiveWatcher(())
    }
}

impl Default for ActiveWatcher {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ActiveWatcher {
    fn drop(&mut self) {
        gauge!(WATCHERS_ACTIVE).decrement(1.0);
    }
}

/// Counts one EDS response sent.
pub fn eds_push() {
    counter!(EDS_PUSHES).increment(1);
}

/// Counts one EDS response a client rejected.
pub fn eds_nack() {
    counter!(EDS_NACKS).increment(1);
}

/// Sets the number of served endpoints with one health status.
pub fn eds_endpoints(health: &'static str, n: u64) {
    gauge!(EDS_ENDPOINTS, "health" => health).set(n as f64);
}

/// Addresses (with their port) of a service that more than one zone announces.
pub fn eds_duplicate_addresses(n: u64) {
    gauge!(EDS_DUPLICATE_ADDRESSES).set(n as f64);
}

/// Every subscribed assignment re-sent on a stream (`eds.endpoint_stale_after`).
pub fn eds_refresh() {
    counter!(EDS_REFRESHES).increment(1);
}

/// Keeps `hdsd_eds_streams_active` right on every exit path.
#[derive(Debug)]
pub struct ActiveEdsStream(());

impl ActiveEdsStream {
    pub fn new() -> Self {
        gauge!(EDS_STREAMS_ACTIVE).increment(1.0);
        ActiveEdsStream(())
    }
}

impl Default for ActiveEdsStream {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ActiveEdsStream {
    fn drop(&mut self) {
        gauge!(EDS_STREAMS_ACTIVE).decrement(1.0);
    }
}

/// Report folding takes microseconds.
const REPORT_BUCKETS: &[f64] = &[
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 0.1,
];
/// A zone's change to the global's acknowledgement: a millisecond on one
/// machine, tens to hundreds across regions, seconds when a link is bad.
const SYNC_LAG_BUCKETS: &[f64] = &[
    5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Specifier generation: microseconds for a small dataplane, milliseconds for a huge one.
const GENERATION_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 2.5e-2, 0.1, 1.0,
];

/// Why the recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up metrics: {0}")]
pub struct MetricsError(String);

static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();

/// Installs the Prometheus recorder (once per process) and describes every metric.
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(REPORT_PROCESSING.into()), REPORT_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(SPECIFIER_GENERATION.into()),
                GENERATION_BUCKETS,
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(UPLINK_SYNC_LAG.into()), SYNC_LAG_BUCKETS)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(READINESS_FOLLOW.into()), SYNC_LAG_BUCKETS)
        })
        .map_err(|e| MetricsError(e.to_string()))?
        .install_recorder()
        .map_err(|e| MetricsError(e.to_string()))?;
    describe();
    let handle = HANDLE.get_or_init(|| handle).clone();
    // Registered against this recorder, once.
    hot();
    // The recorder runs without the exporter's own HTTP listener, so its
    // upkeep (draining histogram samples) is ours to schedule, or samples
    // pile up between scrapes.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

fn describe() {
    describe_counter!(ZONE_REFUSALS, "Zone streams the global refused or ended, by code (unauthenticated, zone_unregistered, zone_timeout, ...).");
    describe_counter!(API_BROWSER_REFUSALS, "API requests refused before any handler for what a browser could do for another site: a Host the open API does not answer to, a cross-origin write, a write without a JSON or YAML Content-Type (reason).");
    describe_gauge!(
        UPLINK_CONNECTED,
        "At a zone: 1 while the global accepts this instance's stream, else 0 (0 on a standby instance too: summed over a zone's instances it is 1 while the zone is connected)."
    );
    describe_gauge!(
        UPLINK_STATE,
        "At a zone: 1 for this instance's uplink state (connecting, connected, disconnected, standby: another instance of the zone holds the uplink lease), 0 for the others."
    );
    describe_counter!(
        UPLINK_DISCONNECTS,
        "At a zone: streams to the global that ended or could not open, by code."
    );
    describe_histogram!(
        UPLINK_SYNC_LAG,
        Unit::Seconds,
        "At a zone: the sync lag, from a dataplane change sent to the global to the global's acknowledgement (it acknowledges once its hub holds the change), on the zone's clock."
    );
    describe_histogram!(
        READINESS_FOLLOW,
        Unit::Seconds,
        "With a shared store: one read of the readiness other instances wrote, from its query until every row is applied here; read=changes: the rows written since the last read (on each notification, at least every second), read=check: the check every reconcile_interval that fetches the rows not seen. A reading that grows delays what other instances' Envoys report from showing here."
    );
    describe_counter!(
        READINESS_FOLLOWED_ROWS,
        "With a shared store: readiness rows other instances wrote that this instance read and applied, by read (changes, check). Rows from check mean the change reads missed them (a dataplane defined here after its readiness was written)."
    );
    describe_counter!(
        SPECIFIER_REJECTIONS,
        "Times a dataplane's Envoy began ending its HDS stream after every specifier (3 streams in a row, each ended within 10 s of a push with no report): it may be rejecting or crashing on it."
    );
    describe_gauge!(
        DATAPLANES_REJECTING,
        "Dataplanes whose Envoy ends its HDS stream after every specifier now (counted at scrape)."
    );
    describe_gauge!(
        TOKEN_EARLIEST_EXPIRY,
        "Seconds until the earliest expiry among the dataplane tokens of the HDS streams this instance holds (at scrape; +Inf when none has an expiring token). A stream ends when its token expires: renew tokens before."
    );
    describe_counter!(
        UNSUPPORTED_PROBES,
        "Probe targets an Envoy was not sent because its version cannot run them (how=left_out: its inbounds read unsupported; how=fallback: a TCP connect was sent instead, hds.check.fallback), counted when an Envoy attaches or a definition changes."
    );
    describe_gauge!(
        STREAMS_ACTIVE,
        "HDS streams currently open (authenticated or waiting for their first message)."
    );
    describe_gauge!(
        STREAMS_WAITING,
        "HDS streams waiting for their dataplane to be defined (unknown node, or deleted within the grace)."
    );
    describe_gauge!(
        AUTH_SIGNING_KEYS,
        "Signing keys whose tokens hdsd accepts now (its own and auth.public_keys); changes when the key files are reloaded."
    );
    describe_counter!(
        STORE_COMMITS,
        "Batches of readiness changes committed to the readiness store."
    );
    describe_counter!(
        STORE_WRITE_FAILURES,
        "Batches of readiness changes the readiness store refused (kept in memory and written with the next batch that succeeds)."
    );
    describe_gauge!(
        STORE_PENDING_WRITES,
        "Readiness updates kept in memory because the store refused them (at most one per dataplane)."
    );
    describe_gauge!(
        STORE_UP,
        "1 while the shared PostgreSQL store answers this instance's heartbeat, 0 while it does not (only with store.kind = \"postgres\")."
    );
    describe_counter!(STREAMS_CLOSED, "HDS streams ended, by reason (ok: the client closed it; others: hdsd ended it with that status).");
    describe_counter!(
        HEALTH_CHECK_REQUESTS,
        "HealthCheckRequest messages received from Envoys."
    );
    describe_counter!(
        REPORTS,
        "EndpointHealthResponse health reports received from Envoys."
    );
    describe_histogram!(
        REPORT_PROCESSING,
        Unit::Seconds,
        "Time from a health report's arrival on its stream to its result being visible (folded into readiness and published to the API and the change feed)."
    );
    describe_counter!(
        REPORT_UNKNOWN_ENDPOINTS,
        "Reported endpoints that the dataplane's current specifier does not contain (ignored)."
    );
    describe_counter!(
        SPECIFIERS_SENT,
        "HealthCheckSpecifier messages sent to Envoys."
    );
    describe_histogram!(
        SPECIFIER_GENERATION,
        Unit::Seconds,
        "Time to build one dataplane's HealthCheckSpecifier."
    );
    describe_counter!(
        SPECIFIER_GENERATION_ERRORS,
        "Dataplane definitions whose specifier could not be built (invalid probe settings)."
    );
    describe_gauge!(
        DATAPLANES,
        "Known dataplanes, by whether an Envoy stream is attached."
    );
    describe_gauge!(
        INBOUNDS,
        "Inbounds of known dataplanes, by readiness status (ready: healthy and not_probed)."
    );
    describe_counter!(
        READINESS_TRANSITIONS,
        "Inbounds that became ready or stopped being ready."
    );
    describe_counter!(
        AUTH_FAILURES,
        "HDS and EDS streams refused by authentication or authorization, by reason."
    );
    describe_gauge!(
        SOURCE_ERRORS,
        "Dataplane files that fail to load now (their last good definitions stay in force)."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label says which hdsd is running."
    );
    describe_counter!(
        FEED_CHANGES,
        "Changes numbered by the change feed (a status, readiness, connection or definition changed; report times alone do not count)."
    );
    describe_gauge!(
        WATCHERS_ACTIVE,
        "Watches open now (gRPC Watch streams and /api/v1/watch event streams)."
    );
    describe_counter!(
        WATCH_EVENTS_SENT,
        "Messages handed to watchers (SNAPSHOT, SYNCED, CHANGED, DELETED, RESYNC)."
    );
    describe_counter!(
        WATCH_RESYNCS,
        "RESYNCs told to watchers, by reason (too_old: history no longer held; unknown_revision: from another process; overflow: the watcher read too slowly)."
    );
    describe_gauge!(
        EDS_STREAMS_ACTIVE,
        "EDS streams open now (Envoys taking endpoints from hdsd)."
    );
    describe_counter!(
        EDS_PUSHES,
        "EDS responses sent (first answers, subscription changes and pushes of changed assignments)."
    );
    describe_counter!(
        EDS_NACKS,
        "EDS responses rejected by the client (NACK: logged, not resent)."
    );
    describe_gauge!(
        EDS_ENDPOINTS,
        "Endpoints in the served assignments, by the health_status sent to Envoy (healthy, degraded, draining, unhealthy)."
    );
    describe_gauge!(
        EDS_DUPLICATE_ADDRESSES,
        "Addresses (address and port of a service) that more than one zone announces: a front gets only its own zone's endpoint at such an address, any other front none (logged with the service and the zones)."
    );
    describe_counter!(
        EDS_REFRESHES,
        "Times a stream re-sent every assignment it follows because eds.endpoint_stale_after is set (every third of it)."
    );
    describe_gauge!(
        CONNECTIONS_OPEN,
        "Connections open now on a listener (hds, api, zones), counted from accept to close."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections closed at accept because a cap was reached, by listener and reason (max_connections, max_connections_per_ip)."
    );
    describe_counter!(
        CONNECTIONS_TIMED_OUT,
        "Connections closed by a deadline, by listener and phase (handshake: no TLS handshake or HTTP start within handshake_timeout; unauthenticated: no request answered with success within unauthenticated_timeout; idle: no request open for idle_timeout; body: a request body not in within api.limits.body_read_timeout)."
    );
    describe_counter!(
        CONNECTIONS_EVICTED,
        "Connections closed to give their slot to a newcomer, by listener and reason (max_connections, max_connections_per_ip): one that had not authenticated yet (the oldest of the newcomer's address at the per-address cap, else the oldest of the address holding the most)."
    );
    describe_counter!(
        ACCEPT_ERRORS,
        "Failed accepts, by listener and kind (out_of_file_descriptors: the listener backs off and retries)."
    );
    describe_counter!(
        LIMIT_HITS,
        "Streams ended, reports dropped or watches refused by a limit, by limit: hds.limits (also EDS streams: max_message_bytes), eds.max_resource_names (max_eds_resource_names), api.limits.max_watches and api.limits.max_watch_names, limits.client_bytes (client_bytes: a stream or request reset or refused by the memory budget)."
    );
    describe_gauge!(
        CLIENT_BYTES,
        Unit::Bytes,
        "The memory budget for clients (limits.client_bytes): bytes hdsd holds on their behalf now (state=held: messages and request bodies that have not arrived whole) and the budget (state=limit)."
    );
    describe_counter!(
        AUTH_RELOADS,
        "Reloads of the signing keys and the revocation list (on changes to those files only); every live stream re-verifies its token after each."
    );
    counter!(AUTH_RELOADS).absolute(0);
    gauge!(DATAPLANES_REJECTING).set(0.0);
    gauge!(TOKEN_EARLIEST_EXPIRY).set(f64::INFINITY);
    for how in ["left_out", "fallback"] {
        counter!(UNSUPPORTED_PROBES, "how" => how).absolute(0);
    }
    for listener in LISTENERS {
        gauge!(CONNECTIONS_OPEN, "listener" => listener).set(0.0);
        for reason in ["max_connections", "max_connections_per_ip"] {
            counter!(CONNECTIONS_EVICTED, "listener" => listener, "reason" => reason).absolute(0);
        }
    }
    for limit in STREAM_LIMITS {
        counter!(LIMIT_HITS, "limit" => limit).absolute(0);
    }
    describe_counter!(
        FILE_LIMIT_HITS,
        "Dataplane files rejected for going past a limit, by limit (not_regular_file, file_size, nesting, aliases, alias_expansion, inbounds, tags, documents, kept_bytes: the dataplanes.max_* settings); counted when the rejection is logged."
    );
    describe_gauge!(
        DOCUMENT_CACHE_BYTES,
        "Bytes the dataplane files' kept parses hold (their text and, per document, what it parsed to), over all files; each file's at most dataplanes.max_kept_bytes."
    );
    describe_gauge!(
        DOCUMENT_CACHE_DOCUMENTS,
        "Documents whose parse is kept for the next version of their file, over all files; each file's at most dataplanes.max_documents."
    );
    gauge!(DOCUMENT_CACHE_BYTES).set(0.0);
    gauge!(DOCUMENT_CACHE_DOCUMENTS).set(0.0);
    // The label values of FILE_LIMIT_HITS, EDS_ENDPOINTS and WATCH_RESYNCS
    // belong to their owners, which zero them where they start
    // (`zero_counters`, `zero_gauges`).
    gauge!(EDS_STREAMS_ACTIVE).set(0.0);
    gauge!(EDS_DUPLICATE_ADDRESSES).set(0.0);
    gauge!(WATCHERS_ACTIVE).set(0.0);
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    gauge!(STREAMS_ACTIVE).set(0.0);
    for reason in CloseReason::ALL {
        counter!(STREAMS_CLOSED, "reason" => reason.as_str()).absolute(0);
    }
    for to in ["ready", "not_ready"] {
        counter!(READINESS_TRANSITIONS, "to" => to).absolute(0);
    }
    for name in [
        HEALTH_CHECK_REQUESTS,
        REPORTS,
        REPORT_UNKNOWN_ENDPOINTS,
        SPECIFIERS_SENT,
        SPECIFIER_GENERATION_ERRORS,
        FEED_CHANGES,
        WATCH_EVENTS_SENT,
        EDS_PUSHES,
        EDS_NACKS,
        EDS_REFRESHES,
        SPECIFIER_REJECTIONS,
    ] {
        counter!(name).absolute(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone<'a>(name: &'a str, state: &'static str) -> ZoneMetrics<'a> {
        ZoneMetrics {
            zone: name,
            state,
            last_seen_unix: Some(1_767_225_600.0),
            dataplanes: 2,
            inbounds_ready: 1,
            inbounds_total: 3,
            streams: 4,
            resumes: 1,
            snapshots: 3,
        }
    }

    /// Each family once, with its help and type; one series per zone and
    /// label value; a zone not in the list has no series at all.
    #[test]
    fn zone_series_are_rendered_from_the_zones_given() {
        let states = ["never_connected", "online", "offline", "disabled"];
        let mut out = String::new();
        render_zones(
            &[zone("eu-1", "online"), zone("us-1", "offline")],
            &states,
            &mut out,
        );
        for line in [
            "# TYPE hdsd_zones gauge",
            "hdsd_zones{state=\"online\"} 1",
            "hdsd_zones{state=\"disabled\"} 0",
            "hdsd_zone_state{zone=\"eu-1\",state=\"online\"} 1",
            "hdsd_zone_state{zone=\"eu-1\",state=\"offline\"} 0",
            "hdsd_zone_last_seen_timestamp_seconds{zone=\"us-1\"} 1767225600",
            "hdsd_zone_inbounds{zone=\"eu-1\",ready=\"false\"} 2",
            "# TYPE hdsd_zone_resumes_total counter",
            "hdsd_zone_resumes_total{zone=\"eu-1\"} 1",
            "hdsd_zone_snapshots_total{zone=\"us-1\"} 3",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in:\n{out}");
        }
        assert_eq!(out.matches("# TYPE hdsd_zone_state ").count(), 1);
        let mut without = String::new();
        render_zones(&[zone("us-1", "offline")], &states, &mut without);
        assert!(!without.contains("eu-1"), "{without}");
    }
}
