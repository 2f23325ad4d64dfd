//! Probe settings (how one inbound is checked) and their validation rules.
//!
//! Envoy never NACKs a `HealthCheckSpecifier`: a zero or missing duration can
//! crash it or make it drop the check silently. Every rule below is checked
//! before anything is sent, each with its own message.
//!
//! [`ProbeSettings`] is the timing of a probe; [`Check`] is what it checks
//! (a TCP connect or payload exchange, an HTTP request, a gRPC health
//! call), each optionally over TLS ([`Tls`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// The effective timing of one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProbeSettings {
    pub interval: Duration,
    pub timeout: Duration,
    /// Envoy's real cadence for HDS clusters (they never carry traffic). Sent
    /// as both `no_traffic_interval` and `no_traffic_healthy_interval`.
    pub no_traffic_interval: Duration,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
}

impl Default for ProbeSettings {
    /// hdsd's documented check defaults: 1s interval and timeout, the
    /// no-traffic interval equal to the interval, thresholds 1 and 2.
    fn default() -> Self {
        ProbeSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            no_traffic_interval: Duration::from_secs(1),
            healthy_threshold: 1,
            unhealthy_threshold: 2,
        }
    }
}

pub const MIN_DURATION: Duration = Duration::from_millis(1);
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// The largest TCP payload hdsd sends to Envoy (each of `send` and `receive`).
pub const MAX_PAYLOAD: usize = 1024;

/// What a probe checks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Check {
    /// A TCP connect, with an optional payload exchange.
    Tcp(TcpCheck),
    /// An HTTP request (HTTP/1.1, or HTTP/2 with `http2`) whose status must be expected.
    Http(HttpCheck),
    /// A `grpc.health.v1.Health/Check` call; SERVING is healthy.
    Grpc(GrpcCheck),
}

impl Default for Check {
    /// A TCP connect: no payload to send, nothing to expect.
    fn default() -> Self {
        Check::Tcp(TcpCheck::default())
    }
}

/// `tcp:`: connect, then optionally send bytes and expect bytes back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TcpCheck {
    pub send: Option<Payload>,
    /// Blocks that must all be found in the answer, in this order.
    pub receive: Vec<Payload>,
    /// Connect over TLS: the handshake must succeed (a connect-only check
    /// then checks the handshake), and the payload travels inside it.
    pub tls: Option<Box<Tls>>,
}

/// A TCP payload as written in the file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Payload {
    /// Sent as its UTF-8 bytes.
    Text(String),
    /// Hex digits, e.g. `"50494e470d0a"`.
    Hex(String),
}

/// `http:`: a GET of `path` whose status must be within `expected_statuses`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpCheck {
    pub path: String,
    /// The Host header; default: the probed `address:port`.
    pub host: Option<String>,
    /// Empty means the default, 200-299.
    pub expected_statuses: Vec<StatusRange>,
    pub headers: BTreeMap<String, String>,
    /// Speak HTTP/2 (prior knowledge, h2c; over TLS, ALPN h2) instead of HTTP/1.1.
    pub http2: bool,
    /// HTTPS: the request goes over TLS.
    pub tls: Option<Box<Tls>>,
}

impl HttpCheck {
    /// A check of `path` with every other field at its default.
    pub fn path(path: impl Into<String>) -> HttpCheck {
        HttpCheck {
            path: path.into(),
            host: None,
            expected_statuses: Vec::new(),
            headers: BTreeMap::new(),
            http2: false,
            tls: None,
        }
    }

    /// The statuses in force: the configured ones, or 200-299.
    pub fn statuses(&self) -> Vec<StatusRange> {
        if self.expected_statuses.is_empty() {
            vec![StatusRange {
                start: 200,
                end: 299,
            }]
        } else {
            self.expected_statuses.clone()
        }
    }
}

/// An inclusive range of HTTP statuses (`200` is `200-200`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusRange {
    pub start: u64,
    pub end: u64,
}

impl fmt::Display for StatusRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// `grpc:`: `grpc.health.v1.Health/Check` over HTTP/2 (h2c).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GrpcCheck {
    /// The `service` of the request; empty asks for the server's overall health.
    pub service: Option<String>,
    /// The `:authority` header; default: the probed `address:port`.
    pub authority: Option<String>,
    /// gRPC over TLS (ALPN h2 unless `alpn` says otherwise).
    pub tls: Option<Box<Tls>>,
}

/// A check's `tls:` block: Envoy speaks TLS to the application, through an
/// `envoy.transport_sockets.tls` transport socket on the probe's cluster.
///
/// The files are paths on the Envoy's machine: hdsd sends them to Envoy
/// and never reads them. Verification is never a silent default: the block
/// names the CA that signs the application's certificate, or says
/// `insecureSkipVerify: true`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tls {
    /// `false` keeps the block written but probes in plaintext.
    pub enabled: bool,
    /// The server name sent in the handshake (SNI); with a CA, the
    /// certificate must also name it (a DNS subject alternative name).
    /// Default: none, and the certificate's names are not checked.
    pub sni: Option<String>,
    /// The CA bundle (PEM) that verifies the application's certificate.
    pub ca_file: Option<String>,
    /// Accept any certificate (no verification). Exclusive with `ca_file`.
    pub insecure_skip_verify: bool,
    /// The certificate Envoy presents to applications that require one (mTLS).
    pub client_cert_file: Option<String>,
    /// The private key of `client_cert_file`.
    pub client_key_file: Option<String>,
    /// ALPN protocols offered; empty: the default ([`Tls::DEFAULT_H2`] for a
    /// check that speaks HTTP/2, none otherwise).
    pub alpn: Vec<String>,
}

impl Tls {
    /// The ALPN a check that speaks HTTP/2 (gRPC, `http2: true`) offers by default.
    pub const DEFAULT_H2: &'static str = "h2";

    /// A block that verifies against `ca_file`, every other field at its default.
    pub fn with_ca(ca_file: impl Into<String>) -> Tls {
        Tls {
            enabled: true,
            sni: None,
            ca_file: Some(ca_file.into()),
            insecure_skip_verify: false,
            client_cert_file: None,
            client_key_file: None,
            alpn: Vec::new(),
        }
    }
}

/// What Envoy is told to do for one check's TLS: a [`Tls`] block that is
/// enabled, its defaults resolved. Two checks with the same `TlsInForce`
/// have the same transport socket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TlsInForce {
    pub sni: Option<String>,
    /// `None`: `insecureSkipVerify` (no verification).
    pub ca_file: Option<String>,
    /// Certificate and key, for mTLS.
    pub client: Option<(String, String)>,
    pub alpn: Vec<String>,
}

impl TlsInForce {
    /// The block that puts this TLS in force, defaults written out (a
    /// check of another kind then gets the same transport socket).
    pub fn into_block(self) -> Tls {
        let (client_cert_file, client_key_file) = self.client.unzip();
        Tls {
            enabled: true,
            sni: self.sni,
            insecure_skip_verify: self.ca_file.is_none(),
            ca_file: self.ca_file,
            client_cert_file,
            client_key_file,
            alpn: self.alpn,
        }
    }
}

/// How a file names a field: Kuma's `serviceProbe` is camelCase YAML,
/// hdsd's configuration file snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    Camel,
    Snake,
}

impl Spelling {
    fn pick(self, camel: &'static str, snake: &'static str) -> &'static str {
        match self {
            Spelling::Camel => camel,
            Spelling::Snake => snake,
        }
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{field} is {value}, outside the allowed range [1ms, 1h]")]
    OutOfRange { field: &'static str, value: Fmt },
    #[error("{field} must be >= 1 (it counts consecutive probe results), got 0")]
    ZeroThreshold { field: &'static str },
    #[error("timeout ({timeout}) must be <= {field} ({other}): a probe may not outlive the gap between probes")]
    TimeoutTooLong {
        timeout: Fmt,
        field: &'static str,
        other: Fmt,
    },
    #[error("set exactly one of http, grpc, tcp (found {0})")]
    SeveralKinds(String),
    #[error("grpc.authority {0:?} is not a valid authority (no spaces or control characters, not empty)")]
    BadAuthority(String),
    #[error("grpc.service {0:?} contains a space or control character; use the fully qualified service name (e.g. my.pkg.Service)")]
    BadService(String),
    #[error("http.path {0:?} must start with '/' (e.g. /healthz)")]
    PathNotAbsolute(String),
    #[error(
        "http.path {0:?} contains a space or control character; percent-encode it (a space is %20)"
    )]
    PathHasSpace(String),
    #[error(
        "http.host {0:?} is not a valid Host header (no spaces or control characters, not empty)"
    )]
    BadHost(String),
    #[error("http.expectedStatuses: {0} is not an HTTP status; use statuses within 100-599")]
    StatusOutOfRange(u64),
    #[error("http.expectedStatuses: range {start}-{end} is reversed; write the lower status first ({end}-{start})")]
    StatusRangeReversed { start: u64, end: u64 },
    #[error(
        "http.headers: {0:?} is not a valid header name; use letters, digits and !#$%&'*+-.^_`|~"
    )]
    BadHeaderName(String),
    #[error("http.headers: {0:?} is set by Envoy itself and cannot be added; use http.host for the Host header")]
    ReservedHeader(String),
    #[error("http.headers: the value of {0:?} contains a control character or newline; remove it")]
    BadHeaderValue(String),
    #[error("tcp.{field} is empty; remove it or give it at least one byte")]
    EmptyPayload { field: &'static str },
    #[error("tcp.{field} is {len} bytes, above the limit of 1024 bytes (1 KiB); check a shorter exchange")]
    PayloadTooLong { field: &'static str, len: usize },
    #[error("tcp.{field} is not hex ({reason}); write pairs of hex digits, e.g. 50494e47")]
    BadHex { field: &'static str, reason: String },
    #[error("{at}: say how Envoy verifies the application's certificate: set {ca} (the CA that signs it, a PEM file on the Envoy's machine) or {skip} (no verification: anyone on the path can pose as the application)")]
    TlsNoVerification {
        at: String,
        ca: &'static str,
        /// `insecureSkipVerify: true` as the file writes it.
        skip: &'static str,
    },
    #[error("{at}: {ca} and {insecure} are both set; verify against the CA or skip verification, not both: remove one")]
    TlsBothVerifications {
        at: String,
        ca: &'static str,
        insecure: &'static str,
    },
    #[error("{field} {value:?} is not an absolute path; give the file's absolute path on the Envoy's machine (hdsd passes it to Envoy and never reads it)")]
    TlsPathNotAbsolute { field: String, value: String },
    #[error("{set} is set but {missing} is not; a client certificate needs its private key: set both, or neither")]
    TlsHalfClientPair { set: String, missing: String },
    #[error("{field} {value:?} is not a host name; SNI is a DNS name (letters, digits, '-' and '.'; labels of 1-63 characters, at most 253 in all), never an IP address")]
    TlsBadSni { field: String, value: String },
    #[error("{field}: {value:?} is not an ALPN protocol id; use 1-255 visible ASCII characters, no spaces (e.g. h2, http/1.1)")]
    TlsBadAlpn { field: String, value: String },
}

impl Payload {
    /// The bytes on the wire.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            Payload::Text(t) => Ok(t.as_bytes().to_vec()),
            Payload::Hex(h) => hex::decode(h).map_err(|e| e.to_string()),
        }
    }

    fn validate(&self, field: &'static str, errors: &mut Vec<ValidationError>) {
        match self.bytes() {
            Err(reason) => errors.push(ValidationError::BadHex { field, reason }),
            Ok(b) if b.is_empty() => errors.push(ValidationError::EmptyPayload { field }),
            Ok(b) if b.len() > MAX_PAYLOAD => errors.push(ValidationError::PayloadTooLong {
                field,
                len: b.len(),
            }),
            Ok(_) => {}
        }
    }
}

/// Headers Envoy manages itself: adding them would be ignored or refused.
fn reserved_header(name: &str) -> bool {
    name.starts_with(':')
        || ["host", "content-length", "transfer-encoding", "connection"]
            .iter()
            .any(|r| name.eq_ignore_ascii_case(r))
}

/// The `exactly one of http, grpc, tcp` rule, over the kinds a `serviceProbe` sets.
pub fn one_kind(kinds: &[&str]) -> Result<(), ValidationError> {
    if kinds.len() > 1 {
        return Err(ValidationError::SeveralKinds(kinds.join(" and ")));
    }
    Ok(())
}

impl Check {
    /// The kind's name as written in the file.
    pub fn kind(&self) -> &'static str {
        match self {
            Check::Tcp(_) => "tcp",
            Check::Http(_) => "http",
            Check::Grpc(_) => "grpc",
        }
    }

    /// The check's `tls` block, enabled or not.
    pub fn tls(&self) -> Option<&Tls> {
        match self {
            Check::Tcp(c) => c.tls.as_deref(),
            Check::Http(c) => c.tls.as_deref(),
            Check::Grpc(c) => c.tls.as_deref(),
        }
    }

    /// Whether the check speaks HTTP/2 (gRPC, or HTTP with `http2`).
    pub fn speaks_h2(&self) -> bool {
        match self {
            Check::Tcp(_) => false,
            Check::Http(c) => c.http2,
            Check::Grpc(_) => true,
        }
    }

    /// The TLS Envoy runs this check over; `None`: plaintext (no block, or
    /// `enabled: false`).
    pub fn tls_in_force(&self) -> Option<TlsInForce> {
        let tls = self.tls().filter(|t| t.enabled)?;
        let alpn = if tls.alpn.is_empty() && self.speaks_h2() {
            vec![Tls::DEFAULT_H2.to_string()]
        } else {
            tls.alpn.clone()
        };
        Some(TlsInForce {
            sni: tls.sni.clone(),
            ca_file: tls.ca_file.clone().filter(|_| !tls.insecure_skip_verify),
            client: tls
                .client_cert_file
                .clone()
                .zip(tls.client_key_file.clone()),
            alpn,
        })
    }

    /// Every broken rule, in a stable order. Empty means valid.
    pub fn validate(&self) -> Vec<ValidationError> {
        let mut errors = Vec::new();
        match self {
            Check::Grpc(grpc) => {
                if let Some(service) = &grpc.service {
                    if service.chars().any(|c| c.is_whitespace() || c.is_control()) {
                        errors.push(ValidationError::BadService(service.clone()));
                    }
                }
                if let Some(authority) = &grpc.authority {
                    if !valid_authority(authority) {
                        errors.push(ValidationError::BadAuthority(authority.clone()));
                    }
                }
            }
            Check::Tcp(tcp) => {
                if let Some(send) = &tcp.send {
                    send.validate("send", &mut errors);
                }
                for r in &tcp.receive {
                    r.validate("receive", &mut errors);
                }
            }
            Check::Http(http) => {
                if let Err(e) = validate_path(&http.path) {
                    errors.push(e);
                }
                if let Some(host) = &http.host {
                    if !valid_authority(host) {
                        errors.push(ValidationError::BadHost(host.clone()));
                    }
                }
                for r in &http.expected_statuses {
                    let ends = if r.start == r.end {
                        &[r.start][..]
                    } else {
                        &[r.start, r.end][..]
                    };
                    for &v in ends {
                        if !(100..=599).contains(&v) {
                            errors.push(ValidationError::StatusOutOfRange(v));
                        }
                    }
                    if r.start > r.end {
                        errors.push(ValidationError::StatusRangeReversed {
                            start: r.start,
                            end: r.end,
                        });
                    }
                }
                for (name, value) in &http.headers {
                    if reserved_header(name) {
                        errors.push(ValidationError::ReservedHeader(name.clone()));
                    } else if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                        errors.push(ValidationError::BadHeaderName(name.clone()));
                    } else if http::HeaderValue::from_str(value).is_err() {
                        errors.push(ValidationError::BadHeaderValue(name.clone()));
                    }
                }
            }
        }
        if let Some(tls) = self.tls() {
            tls.validate(
                &format!("{}.tls", self.kind()),
                Spelling::Camel,
                &mut errors,
            );
        }
        errors
    }
}

impl Tls {
    /// Every broken rule of an enabled block (a disabled one is not sent),
    /// naming each field under `at` (`http.tls`, `hds.check.tls`) as
    /// `spelling` writes it.
    pub fn validate(&self, at: &str, spelling: Spelling, errors: &mut Vec<ValidationError>) {
        if !self.enabled {
            return;
        }
        let field = |camel, snake| format!("{at}.{}", spelling.pick(camel, snake));
        let ca = spelling.pick("caFile", "ca_file");
        let insecure = spelling.pick("insecureSkipVerify", "insecure_skip_verify");
        match (&self.ca_file, self.insecure_skip_verify) {
            (None, false) => errors.push(ValidationError::TlsNoVerification {
                at: at.to_string(),
                ca,
                skip: spelling.pick("insecureSkipVerify: true", "insecure_skip_verify = true"),
            }),
            (Some(_), true) => errors.push(ValidationError::TlsBothVerifications {
                at: at.to_string(),
                ca,
                insecure,
            }),
            _ => {}
        }
        let cert = field("clientCertFile", "client_cert_file");
        let key = field("clientKeyFile", "client_key_file");
        for (name, value) in [
            (field("caFile", "ca_file"), &self.ca_file),
            (cert.clone(), &self.client_cert_file),
            (key.clone(), &self.client_key_file),
        ] {
            if let Some(value) = value.as_ref().filter(|v| !valid_file_path(v)) {
                errors.push(ValidationError::TlsPathNotAbsolute {
                    field: name,
                    value: value.clone(),
                });
            }
        }
        match (&self.client_cert_file, &self.client_key_file) {
            (Some(_), None) => errors.push(ValidationError::TlsHalfClientPair {
                set: cert,
                missing: key,
            }),
            (None, Some(_)) => errors.push(ValidationError::TlsHalfClientPair {
                set: key,
                missing: cert,
            }),
            _ => {}
        }
        if let Some(sni) = self.sni.as_ref().filter(|s| !valid_host_name(s)) {
            errors.push(ValidationError::TlsBadSni {
                field: field("sni", "sni"),
                value: sni.clone(),
            });
        }
        for alpn in self.alpn.iter().filter(|a| !valid_alpn(a)) {
            errors.push(ValidationError::TlsBadAlpn {
                field: field("alpn", "alpn"),
                value: alpn.clone(),
            });
        }
    }
}

/// An absolute path with no control character (Envoy reads it as is).
fn valid_file_path(path: &str) -> bool {
    path.starts_with('/') && !path.chars().any(|c| c.is_control())
}

/// A DNS host name (RFC 1123): what SNI carries (RFC 6066), never an IP literal.
fn valid_host_name(name: &str) -> bool {
    name.len() <= 253
        && name.parse::<std::net::IpAddr>().is_err()
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// An ALPN protocol id as Envoy sends it: 1-255 visible ASCII characters.
fn valid_alpn(id: &str) -> bool {
    (1..=255).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// A Host header or `:authority`: not empty, no space or control character.
fn valid_authority(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The `http.path` rules: starts with `/`, no space or control character.
pub fn validate_path(path: &str) -> Result<(), ValidationError> {
    if !path.starts_with('/') {
        return Err(ValidationError::PathNotAbsolute(path.to_string()));
    }
    if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ValidationError::PathHasSpace(path.to_string()));
    }
    Ok(())
}

/// A duration printed in human form (`1s`, `250ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fmt(pub Duration);

impl fmt::Display for Fmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl ProbeSettings {
    /// Every broken rule, in a stable order. Empty means valid.
    pub fn validate(&self) -> Vec<ValidationError> {
        let mut errors = Vec::new();
        for (field, value) in [
            ("interval", self.interval),
            ("timeout", self.timeout),
            ("no_traffic_interval", self.no_traffic_interval),
        ] {
            if !(MIN_DURATION..=MAX_DURATION).contains(&value) {
                errors.push(ValidationError::OutOfRange {
                    field,
                    value: Fmt(value),
                });
            }
        }
        for (field, value) in [
            ("healthy_threshold", self.healthy_threshold),
            ("unhealthy_threshold", self.unhealthy_threshold),
        ] {
            if value == 0 {
                errors.push(ValidationError::ZeroThreshold { field });
            }
        }
        for (field, other) in [
            ("interval", self.interval),
            ("no_traffic_interval", self.no_traffic_interval),
        ] {
            // An unset no_traffic_interval is the interval: one rule broken,
            // one message.
            let same_rule = field == "no_traffic_interval" && other == self.interval;
            if self.timeout > other && !same_rule {
                errors.push(ValidationError::TimeoutTooLong {
                    timeout: Fmt(self.timeout),
                    field,
                    other: Fmt(other),
                });
            }
        }
        errors
    }

    /// Worst-case time from an application dying to hdsd knowing it:
    /// `unhealthy_threshold x no_traffic_interval + timeout + report_interval`.
    pub fn worst_case_detection(&self, report_interval: Duration) -> Duration {
        self.no_traffic_interval * self.unhealthy_threshold + self.timeout + report_interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> ProbeSettings {
        ProbeSettings::default()
    }

    #[test]
    fn defaults_are_valid() {
        assert!(ok().validate().is_empty());
    }

    #[test]
    fn each_rule_has_its_message() {
        let cases: Vec<(ProbeSettings, &str)> = vec![
            (
                ProbeSettings {
                    timeout: Duration::ZERO,
                    ..ok()
                },
                "timeout is 0s, outside the allowed range [1ms, 1h]",
            ),
            (
                ProbeSettings {
                    interval: Duration::from_secs(7200),
                    ..ok()
                },
                "interval is 2h, outside the allowed range [1ms, 1h]",
            ),
            (
                ProbeSettings {
                    no_traffic_interval: Duration::from_secs(7200),
                    ..ok()
                },
                "no_traffic_interval is 2h, outside the allowed range [1ms, 1h]",
            ),
            (
                ProbeSettings {
                    healthy_threshold: 0,
                    ..ok()
                },
                "healthy_threshold must be >= 1 (it counts consecutive probe results), got 0",
            ),
            (
                ProbeSettings {
                    unhealthy_threshold: 0,
                    ..ok()
                },
                "unhealthy_threshold must be >= 1 (it counts consecutive probe results), got 0",
            ),
            (
                ProbeSettings {
                    timeout: Duration::from_secs(2),
                    no_traffic_interval: Duration::from_secs(5),
                    ..ok()
                },
                "timeout (2s) must be <= interval (1s): a probe may not outlive the gap between probes",
            ),
            (
                ProbeSettings {
                    interval: Duration::from_secs(5),
                    timeout: Duration::from_secs(2),
                    no_traffic_interval: Duration::from_secs(1),
                    ..ok()
                },
                "timeout (2s) must be <= no_traffic_interval (1s): a probe may not outlive the gap between probes",
            ),
        ];
        for (settings, message) in cases {
            let errors = settings.validate();
            assert_eq!(errors.len(), 1, "{settings:?} -> {errors:?}");
            assert_eq!(errors[0].to_string(), message);
        }
    }

    fn http(f: impl FnOnce(&mut HttpCheck)) -> Check {
        let mut h = HttpCheck::path("/healthz");
        f(&mut h);
        Check::Http(h)
    }

    fn tcp(send: Option<Payload>, receive: Vec<Payload>) -> Check {
        Check::Tcp(TcpCheck {
            send,
            receive,
            tls: None,
        })
    }

    #[test]
    fn valid_checks() {
        let full = http(|h| {
            h.host = Some("web.internal".into());
            h.expected_statuses = vec![
                StatusRange {
                    start: 200,
                    end: 200,
                },
                StatusRange {
                    start: 100,
                    end: 599,
                },
            ];
            h.headers.insert("X-Probe".into(), "hdsd".into());
            h.http2 = true;
        });
        let text = Payload::Text("PING\r\n".into());
        let kib = Payload::Hex("ab".repeat(MAX_PAYLOAD));
        for check in [
            Check::default(),
            full,
            tcp(Some(text), vec![kib]),
            Check::Grpc(GrpcCheck {
                service: Some("shop.Cart".into()),
                authority: Some("cart.internal:8080".into()),
                tls: None,
            }),
            Check::Grpc(GrpcCheck::default()),
        ] {
            assert!(
                check.validate().is_empty(),
                "{check:?}: {:?}",
                check.validate()
            );
        }
    }

    #[test]
    fn each_check_rule_has_its_message() {
        let range = |start, end| StatusRange { start, end };
        let cases: Vec<(Check, &str)> = vec![
            (
                http(|h| h.path = "healthz".into()),
                "http.path \"healthz\" must start with '/' (e.g. /healthz)",
            ),
            (
                http(|h| h.path = "/health z".into()),
                "http.path \"/health z\" contains a space or control character; percent-encode it (a space is %20)",
            ),
            (
                http(|h| h.host = Some("web internal".into())),
                "http.host \"web internal\" is not a valid Host header (no spaces or control characters, not empty)",
            ),
            (
                http(|h| h.expected_statuses = vec![range(200, 600)]),
                "http.expectedStatuses: 600 is not an HTTP status; use statuses within 100-599",
            ),
            (
                http(|h| h.expected_statuses = vec![range(99, 99)]),
                "http.expectedStatuses: 99 is not an HTTP status; use statuses within 100-599",
            ),
            (
                http(|h| h.expected_statuses = vec![range(299, 200)]),
                "http.expectedStatuses: range 299-200 is reversed; write the lower status first (200-299)",
            ),
            (
                http(|h| {
                    h.headers.insert("X Probe".into(), "a".into());
                }),
                "http.headers: \"X Probe\" is not a valid header name; use letters, digits and !#$%&'*+-.^_`|~",
            ),
            (
                http(|h| {
                    h.headers.insert("Host".into(), "a".into());
                }),
                "http.headers: \"Host\" is set by Envoy itself and cannot be added; use http.host for the Host header",
            ),
            (
                http(|h| {
                    h.headers.insert(":path".into(), "/x".into());
                }),
                "http.headers: \":path\" is set by Envoy itself and cannot be added; use http.host for the Host header",
            ),
            (
                http(|h| {
                    h.headers.insert("X-A".into(), "a\r\nb".into());
                }),
                "http.headers: the value of \"X-A\" contains a control character or newline; remove it",
            ),
            (
                tcp(Some(Payload::Text(String::new())), vec![]),
                "tcp.send is empty; remove it or give it at least one byte",
            ),
            (
                tcp(None, vec![Payload::Text("x".repeat(MAX_PAYLOAD + 1))]),
                "tcp.receive is 1025 bytes, above the limit of 1024 bytes (1 KiB); check a shorter exchange",
            ),
            (
                tcp(Some(Payload::Hex("50494e4".into())), vec![]),
                "tcp.send is not hex (Odd number of digits); write pairs of hex digits, e.g. 50494e47",
            ),
            (
                tcp(Some(Payload::Hex("zz".into())), vec![]),
                "tcp.send is not hex (Invalid character 'z' at position 0); write pairs of hex digits, e.g. 50494e47",
            ),
            (
                Check::Grpc(GrpcCheck {
                    service: Some("shop Cart".into()),
                    authority: None,
                    tls: None,
                }),
                "grpc.service \"shop Cart\" contains a space or control character; use the fully qualified service name (e.g. my.pkg.Service)",
            ),
            (
                Check::Grpc(GrpcCheck {
                    service: None,
                    authority: Some(String::new()),
                    tls: None,
                }),
                "grpc.authority \"\" is not a valid authority (no spaces or control characters, not empty)",
            ),
        ];
        for (check, message) in cases {
            let errors = check.validate();
            assert_eq!(errors.len(), 1, "{check:?} -> {errors:?}");
            assert_eq!(errors[0].to_string(), message);
        }
        assert_eq!(
            one_kind(&["http", "tcp"]).unwrap_err().to_string(),
            "set exactly one of http, grpc, tcp (found http and tcp)"
        );
        assert!(one_kind(&["grpc"]).is_ok() && one_kind(&[]).is_ok());
    }

    #[test]
    fn payload_bytes_and_default_statuses() {
        assert_eq!(
            Payload::Hex("50494E470d0a".into()).bytes().unwrap(),
            b"PING\r\n"
        );
        assert_eq!(Payload::Text("PONG".into()).bytes().unwrap(), b"PONG");
        assert_eq!(
            HttpCheck::path("/").statuses(),
            vec![StatusRange {
                start: 200,
                end: 299
            }]
        );
        assert_eq!(
            StatusRange {
                start: 200,
                end: 200
            }
            .to_string(),
            "200"
        );
        assert_eq!(
            StatusRange {
                start: 300,
                end: 302
            }
            .to_string(),
            "300-302"
        );
    }

    fn https(f: impl FnOnce(&mut Tls)) -> Check {
        let mut tls = Tls::with_ca("/etc/envoy/app-ca.pem");
        f(&mut tls);
        http(|h| h.tls = Some(Box::new(tls)))
    }

    #[test]
    fn valid_tls_blocks() {
        let full = |t: &mut Tls| {
            t.sni = Some("web.internal".into());
            t.client_cert_file = Some("/etc/envoy/probe.pem".into());
            t.client_key_file = Some("/etc/envoy/probe.key".into());
            t.alpn = vec!["h2".into(), "http/1.1".into()];
        };
        let insecure = |t: &mut Tls| {
            t.ca_file = None;
            t.insecure_skip_verify = true;
        };
        // A disabled block is not sent, so not checked.
        let off = |t: &mut Tls| {
            t.enabled = false;
            t.ca_file = None;
            t.sni = Some("not a name".into());
        };
        let tcp_tls = Check::Tcp(TcpCheck {
            tls: Some(Box::new(Tls::with_ca("/ca.pem"))),
            ..TcpCheck::default()
        });
        let grpc_tls = Check::Grpc(GrpcCheck {
            tls: Some(Box::new(Tls::with_ca("/ca.pem"))),
            ..GrpcCheck::default()
        });
        for check in [https(full), https(insecure), https(off), tcp_tls, grpc_tls] {
            assert!(
                check.validate().is_empty(),
                "{check:?}: {:?}",
                check.validate()
            );
        }
    }

    #[test]
    fn each_tls_rule_has_its_message() {
        let cases: Vec<(Check, &str)> = vec![
            (
                https(|t| t.ca_file = None),
                "http.tls: say how Envoy verifies the application's certificate: set caFile (the CA that signs it, a PEM file on the Envoy's machine) or insecureSkipVerify: true (no verification: anyone on the path can pose as the application)",
            ),
            (
                https(|t| t.insecure_skip_verify = true),
                "http.tls: caFile and insecureSkipVerify are both set; verify against the CA or skip verification, not both: remove one",
            ),
            (
                https(|t| t.ca_file = Some("certs/ca.pem".into())),
                "http.tls.caFile \"certs/ca.pem\" is not an absolute path; give the file's absolute path on the Envoy's machine (hdsd passes it to Envoy and never reads it)",
            ),
            (
                https(|t| {
                    t.client_cert_file = Some("/probe.pem".into());
                }),
                "http.tls.clientCertFile is set but http.tls.clientKeyFile is not; a client certificate needs its private key: set both, or neither",
            ),
            (
                https(|t| {
                    t.client_key_file = Some("/probe.key".into());
                }),
                "http.tls.clientKeyFile is set but http.tls.clientCertFile is not; a client certificate needs its private key: set both, or neither",
            ),
            (
                https(|t| {
                    t.client_cert_file = Some("/probe.pem".into());
                    t.client_key_file = Some("probe.key".into());
                }),
                "http.tls.clientKeyFile \"probe.key\" is not an absolute path; give the file's absolute path on the Envoy's machine (hdsd passes it to Envoy and never reads it)",
            ),
            (
                https(|t| t.sni = Some("10.0.0.7".into())),
                "http.tls.sni \"10.0.0.7\" is not a host name; SNI is a DNS name (letters, digits, '-' and '.'; labels of 1-63 characters, at most 253 in all), never an IP address",
            ),
            (
                https(|t| t.sni = Some("web..internal".into())),
                "http.tls.sni \"web..internal\" is not a host name; SNI is a DNS name (letters, digits, '-' and '.'; labels of 1-63 characters, at most 253 in all), never an IP address",
            ),
            (
                https(|t| t.alpn = vec!["h 2".into()]),
                "http.tls.alpn: \"h 2\" is not an ALPN protocol id; use 1-255 visible ASCII characters, no spaces (e.g. h2, http/1.1)",
            ),
            (
                Check::Grpc(GrpcCheck {
                    tls: Some(Box::new(Tls {
                        alpn: vec![String::new()],
                        ..Tls::with_ca("/ca.pem")
                    })),
                    ..GrpcCheck::default()
                }),
                "grpc.tls.alpn: \"\" is not an ALPN protocol id; use 1-255 visible ASCII characters, no spaces (e.g. h2, http/1.1)",
            ),
            (
                Check::Tcp(TcpCheck {
                    tls: Some(Box::new(Tls {
                        ca_file: Some("/ca\n.pem".into()),
                        ..Tls::with_ca("/ca.pem")
                    })),
                    ..TcpCheck::default()
                }),
                "tcp.tls.caFile \"/ca\\n.pem\" is not an absolute path; give the file's absolute path on the Envoy's machine (hdsd passes it to Envoy and never reads it)",
            ),
        ];
        for (check, message) in cases {
            let errors = check.validate();
            assert_eq!(errors.len(), 1, "{check:?} -> {errors:?}");
            assert_eq!(errors[0].to_string(), message);
        }
        // The configuration file spells the same rules in snake_case.
        let mut errors = Vec::new();
        Tls {
            client_cert_file: Some("/probe.pem".into()),
            insecure_skip_verify: true,
            ..Tls::with_ca("/ca.pem")
        }
        .validate("hds.check.tls", Spelling::Snake, &mut errors);
        let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            messages,
            [
                "hds.check.tls: ca_file and insecure_skip_verify are both set; verify against the CA or skip verification, not both: remove one",
                "hds.check.tls.client_cert_file is set but hds.check.tls.client_key_file is not; a client certificate needs its private key: set both, or neither",
            ]
        );
    }

    #[test]
    fn tls_in_force_resolves_the_defaults() {
        let ca = Tls::with_ca("/ca.pem");
        // No block, or a disabled one: plaintext.
        assert_eq!(Check::default().tls_in_force(), None);
        let off = Tls {
            enabled: false,
            ..ca.clone()
        };
        assert_eq!(https(|t| *t = off.clone()).tls_in_force(), None);
        // HTTP/1.1 offers no ALPN; HTTP/2 and gRPC offer h2 unless told otherwise.
        let plain = https(|_| {}).tls_in_force().unwrap();
        assert_eq!(plain.alpn, Vec::<String>::new());
        assert_eq!(plain.ca_file.as_deref(), Some("/etc/envoy/app-ca.pem"));
        let h2 = http(|h| {
            h.http2 = true;
            h.tls = Some(Box::new(ca.clone()));
        });
        assert_eq!(h2.tls_in_force().unwrap().alpn, ["h2"]);
        let grpc = Check::Grpc(GrpcCheck {
            tls: Some(Box::new(ca.clone())),
            ..GrpcCheck::default()
        });
        assert_eq!(grpc.tls_in_force().unwrap().alpn, ["h2"]);
        let grpc_own = Check::Grpc(GrpcCheck {
            tls: Some(Box::new(Tls {
                alpn: vec!["grpc-exp".into()],
                ..ca.clone()
            })),
            ..GrpcCheck::default()
        });
        assert_eq!(grpc_own.tls_in_force().unwrap().alpn, ["grpc-exp"]);
        // insecureSkipVerify: no CA; a client pair travels together.
        let t = https(|t| {
            t.ca_file = None;
            t.insecure_skip_verify = true;
            t.client_cert_file = Some("/c.pem".into());
            t.client_key_file = Some("/c.key".into());
        })
        .tls_in_force()
        .unwrap();
        assert_eq!(t.ca_file, None);
        assert_eq!(t.client, Some(("/c.pem".into(), "/c.key".into())));
    }

    #[test]
    fn detection_bound() {
        let s = ProbeSettings {
            no_traffic_interval: Duration::from_secs(2),
            unhealthy_threshold: 3,
            timeout: Duration::from_millis(500),
            ..ok()
        };
        assert_eq!(
            s.worst_case_detection(Duration::from_secs(5)),
            Duration::from_millis(11_500)
        );
    }
}
