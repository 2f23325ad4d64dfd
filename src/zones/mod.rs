//! Zones: a zone hdsd syncs its dataplanes to the global hdsd over one
//! gRPC stream (`proto/hdsd/v1/zone.proto`, `hdsd.v1.ZoneSyncService`).
//!
//! Everything here is pure, like [`crate::hds::stream`]: events in, actions
//! out, time passed in as a [`Timestamp`]. The drivers that turn a network
//! stream, the change feed and timers into events live above.
//!
//! - [`uplink`]: the zone's side of one stream (hello, snapshot in chunks or
//!   resume, changes, heartbeats, what to do when refused).
//! - [`session`]: the global's side of one stream (who may speak for which
//!   zone and mesh, the version skew rule, snapshots, acknowledgements).
//! - [`remote`]: what the global holds of one zone across streams: its
//!   dataplanes, the revision it holds, the uplink lease's epoch, liveness
//!   inputs; deletions of a snapshot only once it is complete.
//! - [`liveness`]: online, offline, disabled, never connected, from the
//!   global's own times.
//! - [`backoff`]: the zone's reconnect delays (exponential, full jitter).
//!
//! Here: the protocol version and the skew rule both sides apply, the
//! stable codes of refusals, the meshes a zone's credential allows, and the
//! conversions between [`Duration`] and protobuf.

pub mod backoff;
pub mod certificate;
pub mod changes;
pub mod hub;
pub mod liveness;
pub mod remote;
pub mod session;
pub mod uplink;

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::clock::Timestamp;

/// The zone sync protocol version this hdsd speaks (`Hello.protocol_version`
/// and `Accepted.protocol_version`).
pub const PROTOCOL_VERSION: u32 = 1;

/// The capability of a zone that can continue from `Accepted.resume_from`
/// without a snapshot. A global sends `resume_from` only to a zone that
/// names it.
pub const CAPABILITY_RESUME: &str = "resume";

/// The capabilities this hdsd names in its hello (as a zone) and its
/// `Accepted` (as the global).
pub const CAPABILITIES: &[&str] = &[CAPABILITY_RESUME];

/// This hdsd's release, as a hello names it.
pub const HDSD_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The stable codes of `GlobalMessage.Refused` and `Rejected`, and of the
/// zone's own reasons to close a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    /// The zone is not registered at the global, and the global does not
    /// register zones itself (`global.auto_register = false`). Permanent.
    ZoneUnregistered,
    /// An operator disabled the zone at the global. Permanent.
    ZoneDisabled,
    /// The two sides' protocol versions do not fit the skew rule. Permanent.
    VersionIncompatible,
    /// The hello's lease epoch is lower than one the global already
    /// accepted for the zone: another instance holds the uplink. Permanent
    /// for this epoch.
    StaleEpoch,
    /// A stream of the zone with an epoch at least as high was accepted;
    /// this one ends. Permanent for this epoch.
    Superseded,
    /// A message out of order or malformed (a bug on one side). Retryable.
    ProtocolViolation,
    /// The zone's hello (or, at the zone, the global's `Accepted`) did not
    /// come in time. Retryable.
    HelloTimeout,
    /// Nothing came from the other side for `zone_timeout`. Retryable.
    ZoneTimeout,
    /// The global is shutting down. Retryable.
    ShuttingDown,
    /// The transport ended the stream. Retryable.
    StreamClosed,
    /// One dataplane of a mesh the zone's credential does not allow; the
    /// stream goes on (`Rejected`).
    MeshNotAllowed,
    /// One dataplane whose mesh or name breaks the naming rules; the stream
    /// goes on (`Rejected`).
    InvalidDataplane,
    /// The zone's credential names another zone than its `zone.name`: at
    /// the global, the Hello's `zone` is not the credential's (refused
    /// before the stream takes anything over); at the zone, the global's
    /// `Accepted` names another zone (a global that predates the Hello's
    /// `zone`). Permanent: the token or the setting must change.
    ZoneNameMismatch,
    /// The credential does not open a stream: the global's gRPC layer
    /// refuses a bad, expired or revoked token with this code; the session
    /// refuses one issued before the zone's deletion. Permanent: the zone
    /// needs a new token.
    Unauthenticated,
    /// A supersede storm: two holders of one zone credential dial in turn;
    /// the global keeps the online holder and refuses the other. Permanent:
    /// one credential belongs to one zone.
    UplinkContested,
    /// The hello's lease epoch is further ahead of the global's clock than
    /// any lease gives (an epoch is the lease's time in microseconds, or a
    /// counter below it). Retryable.
    EpochAhead,
}

impl Code {
    /// Every code.
    pub const ALL: [Code; 16] = [
        Code::ZoneUnregistered,
        Code::ZoneDisabled,
        Code::VersionIncompatible,
        Code::StaleEpoch,
        Code::Superseded,
        Code::ProtocolViolation,
        Code::HelloTimeout,
        Code::ZoneTimeout,
        Code::ShuttingDown,
        Code::StreamClosed,
        Code::MeshNotAllowed,
        Code::InvalidDataplane,
        Code::ZoneNameMismatch,
        Code::Unauthenticated,
        Code::UplinkContested,
        Code::EpochAhead,
    ];

    /// The stable word of the code (`zone_unregistered`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Code::ZoneUnregistered => "zone_unregistered",
            Code::ZoneDisabled => "zone_disabled",
            Code::VersionIncompatible => "version_incompatible",
            Code::StaleEpoch => "stale_epoch",
            Code::Superseded => "superseded",
            Code::ProtocolViolation => "protocol_violation",
            Code::HelloTimeout => "hello_timeout",
            Code::ZoneTimeout => "zone_timeout",
            Code::ShuttingDown => "shutting_down",
            Code::StreamClosed => "stream_closed",
            Code::MeshNotAllowed => "mesh_not_allowed",
            Code::InvalidDataplane => "invalid_dataplane",
            Code::ZoneNameMismatch => "zone_name_mismatch",
            Code::Unauthenticated => "unauthenticated",
            Code::UplinkContested => "uplink_contested",
            Code::EpochAhead => "epoch_ahead",
        }
    }

    /// The code of a stable word; `None` for a word this hdsd does not know
    /// (a newer peer's).
    pub fn parse(word: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == word)
    }

    /// True when reconnecting cannot succeed until an operator changes
    /// something (or the lease moves to a higher epoch): a zone refused so
    /// retries only at its backoff's longest delay.
    pub fn permanent(self) -> bool {
        matches!(
            self,
            Code::ZoneUnregistered
                | Code::ZoneDisabled
                | Code::VersionIncompatible
                | Code::StaleEpoch
                | Code::Superseded
                | Code::ZoneNameMismatch
                | Code::Unauthenticated
                | Code::UplinkContested
        )
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One side's version, as its hello (or `Accepted`) names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerVersion {
    /// The zone sync protocol version.
    pub protocol: u32,
    /// The hdsd release (free text from the peer; shown debug-escaped).
    pub hdsd: String,
}

impl PeerVersion {
    /// This hdsd's own version.
    pub fn ours() -> PeerVersion {
        PeerVersion {
            protocol: PROTOCOL_VERSION,
            hdsd: HDSD_VERSION.to_string(),
        }
    }
}

impl fmt::Display for PeerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "version {} (hdsd {:?})", self.protocol, self.hdsd)
    }
}

/// Why a zone and a global cannot sync: the skew rule is "upgrade the
/// global first; a global accepts zones of its own protocol version and of
/// the one before".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionSkew {
    /// The zone named no protocol version (0).
    #[error("zone {zone:?} sent no zone sync protocol version (0), the global speaks {global}: upgrade the zone to the global's hdsd release")]
    Missing {
        /// The zone's name.
        zone: String,
        /// The global's version.
        global: PeerVersion,
    },
    /// The zone is newer than the global.
    #[error("zone {zone:?} speaks zone sync protocol {zone_version}, newer than the global's {global}: upgrade the global first (a global accepts zones of its own protocol version and of the one before)")]
    ZoneNewer {
        /// The zone's name.
        zone: String,
        /// The zone's version.
        zone_version: PeerVersion,
        /// The global's version.
        global: PeerVersion,
    },
    /// The zone is older than the one version before the global's.
    #[error("zone {zone:?} speaks zone sync protocol {zone_version}, older than the global's {global} accepts (its own and the one before): upgrade the zone to the global's hdsd release")]
    ZoneTooOld {
        /// The zone's name.
        zone: String,
        /// The zone's version.
        zone_version: PeerVersion,
        /// The global's version.
        global: PeerVersion,
    },
}

/// The skew rule, which both sides apply: `zone` may sync with `global`
/// when it speaks the same protocol version or the one before.
pub fn check_versions(
    zone_name: &str,
    zone: &PeerVersion,
    global: &PeerVersion,
) -> Result<(), VersionSkew> {
    let (z, g) = (zone.protocol, global.protocol);
    if z == 0 {
        return Err(VersionSkew::Missing {
            zone: zone_name.to_string(),
            global: global.clone(),
        });
    }
    if z > g {
        return Err(VersionSkew::ZoneNewer {
            zone: zone_name.to_string(),
            zone_version: zone.clone(),
            global: global.clone(),
        });
    }
    if z + 1 < g {
        return Err(VersionSkew::ZoneTooOld {
            zone: zone_name.to_string(),
            zone_version: zone.clone(),
            global: global.clone(),
        });
    }
    Ok(())
}

/// The meshes a zone's credential allows it to sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meshes {
    /// Every mesh.
    All,
    /// Only these (possibly none).
    Only(BTreeSet<String>),
}

impl Meshes {
    /// Whether a dataplane of `mesh` may be synced.
    pub fn allows(&self, mesh: &str) -> bool {
        match self {
            Meshes::All => true,
            Meshes::Only(set) => set.contains(mesh),
        }
    }
}

impl fmt::Display for Meshes {
    /// "every mesh", "no mesh", or the meshes separated by ", ".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Meshes::All => f.write_str("every mesh"),
            Meshes::Only(set) if set.is_empty() => f.write_str("no mesh"),
            Meshes::Only(set) => {
                let list: Vec<&str> = set.iter().map(String::as_str).collect();
                f.write_str(&list.join(", "))
            }
        }
    }
}

/// `t + d`, saturating at the latest time chrono can hold.
pub fn plus(t: Timestamp, d: Duration) -> Timestamp {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
}

/// How long after `earlier` `now` is; `None` when `now` is before it (a
/// clock that stepped back).
pub fn elapsed(earlier: Timestamp, now: Timestamp) -> Option<Duration> {
    (now - earlier).to_std().ok()
}

/// A [`Duration`] as protobuf (saturating at protobuf's `i64` seconds).
pub fn to_proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

/// A protobuf duration as a [`Duration`]; `None` when it is negative or its
/// nanoseconds are out of range.
pub fn from_proto_duration(d: &prost_types::Duration) -> Option<Duration> {
    let seconds = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok().filter(|n| *n < 1_000_000_000)?;
    Some(Duration::new(seconds, nanos))
}

/// A duration as people read it ("30s", "1m 30s").
pub(crate) fn human(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(protocol: u32) -> PeerVersion {
        PeerVersion {
            protocol,
            hdsd: format!("0.{protocol}.0"),
        }
    }

    /// The machines are pure: beside the zones layer itself they name only
    /// the leaves, the core and the view (not the state layer's tasks, the
    /// feed or the registry; the drivers above turn those into events), and
    /// the layer sits above the view and the cluster, below the consumers.
    #[test]
    fn the_zones_modules_name_only_leaves_core_and_view() {
        use crate::layers::{check_file, layer_of, LAYERS};
        let allowed: Vec<usize> = ["leaves", "core", "view", "zones"]
            .iter()
            .map(|name| LAYERS.iter().position(|(n, _, _)| n == name).unwrap())
            .collect();
        let zones = layer_of("zones").unwrap();
        assert!(
            layer_of("view").unwrap() < zones,
            "zones sit above the view"
        );
        assert_eq!(
            layer_of("consumers").unwrap(),
            zones + 1,
            "and below the consumers"
        );
        let files = [
            ("mod.rs", include_str!("mod.rs")),
            ("backoff.rs", include_str!("backoff.rs")),
            ("liveness.rs", include_str!("liveness.rs")),
            ("remote.rs", include_str!("remote.rs")),
            ("session.rs", include_str!("session.rs")),
            ("uplink.rs", include_str!("uplink.rs")),
        ];
        for (file, text) in files {
            assert_eq!(check_file(file, "zones", text), []);
            let code = text.split("#[cfg(test)]").next().unwrap();
            for line in code.lines() {
                let line = line.split("//").next().unwrap();
                for part in line.split("crate::").skip(1) {
                    let module: String = part
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let layer = layer_of(&module);
                    assert!(
                        layer.is_some_and(|l| allowed.contains(&l)),
                        "src/zones/{file} names crate::{module}: {line}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_global_accepts_its_own_version_and_the_one_before() {
        assert_eq!(check_versions("eu-1", &v(3), &v(3)), Ok(()));
        assert_eq!(check_versions("eu-1", &v(2), &v(3)), Ok(()));
        assert!(matches!(
            check_versions("eu-1", &v(1), &v(3)),
            Err(VersionSkew::ZoneTooOld { .. })
        ));
        assert!(matches!(
            check_versions("eu-1", &v(4), &v(3)),
            Err(VersionSkew::ZoneNewer { .. })
        ));
        // Version 0 is no version, even next to a global of version 1.
        assert!(matches!(
            check_versions("eu-1", &v(0), &v(1)),
            Err(VersionSkew::Missing { .. })
        ));
    }

    #[test]
    fn a_skew_names_the_zone_both_versions_and_what_to_upgrade() {
        let newer = check_versions("eu-1", &v(4), &v(3))
            .unwrap_err()
            .to_string();
        for part in [
            "\"eu-1\"",
            "version 4",
            "\"0.4.0\"",
            "version 3",
            "\"0.3.0\"",
            "upgrade the global first",
        ] {
            assert!(newer.contains(part), "{part}: {newer}");
        }
        let older = check_versions("eu-1", &v(1), &v(3))
            .unwrap_err()
            .to_string();
        for part in ["\"eu-1\"", "version 1", "version 3", "upgrade the zone"] {
            assert!(older.contains(part), "{part}: {older}");
        }
    }

    #[test]
    fn codes_round_trip_and_say_which_are_permanent() {
        for code in Code::ALL {
            assert_eq!(Code::parse(code.as_str()), Some(code));
        }
        assert_eq!(Code::parse("from_the_future"), None);
        let permanent: Vec<&str> = Code::ALL
            .into_iter()
            .filter(|c| c.permanent())
            .map(Code::as_str)
            .collect();
        assert_eq!(
            permanent,
            [
                "zone_unregistered",
                "zone_disabled",
                "version_incompatible",
                "stale_epoch",
                "superseded",
                "zone_name_mismatch",
                "unauthenticated",
                "uplink_contested"
            ]
        );
    }

    #[test]
    fn meshes_allow_and_describe() {
        let only = Meshes::Only(["shop".to_string(), "default".to_string()].into());
        assert!(only.allows("shop") && !only.allows("payments"));
        assert!(Meshes::All.allows("anything"));
        assert_eq!(only.to_string(), "default, shop");
        assert_eq!(Meshes::Only(BTreeSet::new()).to_string(), "no mesh");
        assert_eq!(Meshes::All.to_string(), "every mesh");
    }

    #[test]
    fn durations_convert_and_refuse_negative_ones() {
        let d = Duration::from_millis(1500);
        assert_eq!(from_proto_duration(&to_proto_duration(d)), Some(d));
        let negative = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert_eq!(from_proto_duration(&negative), None);
        let bad_nanos = prost_types::Duration {
            seconds: 1,
            nanos: 1_000_000_000,
        };
        assert_eq!(from_proto_duration(&bad_nanos), None);
    }

    #[test]
    fn time_arithmetic_saturates_and_sees_a_clock_stepping_back() {
        let t = chrono::DateTime::<chrono::Utc>::MAX_UTC;
        assert_eq!(plus(t, Duration::from_secs(1)), t);
        let now = chrono::Utc::now();
        assert_eq!(
            elapsed(now, plus(now, Duration::from_secs(2))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(elapsed(plus(now, Duration::from_secs(2)), now), None);
    }
}
