//! The dataplane as hdsd holds it: its identity, its inbounds, its kind, and
//! what its `serviceProbe`s override; plain data, whatever file it came from.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::probe::{Check, ProbeSettings};

/// The tag that names an inbound's service: services and EDS clusters group
/// inbounds by it.
pub const SERVICE_TAG: &str = "kuma.io/service";

/// `<mesh>.<name>`: the identity of a dataplane, and Envoy's `node.id`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DataplaneId {
    pub mesh: String,
    pub name: String,
}

impl DataplaneId {
    /// An identity from parts already known to be valid (they come from a
    /// parsed dataplane or a verified token). Input from users goes through
    /// [`DataplaneId::try_new`] or `parse`.
    pub fn new(mesh: impl Into<String>, name: impl Into<String>) -> Self {
        DataplaneId {
            mesh: mesh.into(),
            name: name.into(),
        }
    }

    /// The identity `mesh.name`, validated by [`crate::names`]' rules (as
    /// Kuma's): the mesh a DNS-1123 label (no dot: the node id is
    /// `<mesh>.<name>`), the name lowercase letters, digits, '-', '_' and
    /// '.', at most 253 characters. Every name that enters hdsd (files,
    /// the API, tokens, HDS node ids) comes through here.
    pub fn try_new(
        mesh: impl Into<String>,
        name: impl Into<String>,
    ) -> Result<DataplaneId, BadIdentity> {
        let (mesh, name) = (mesh.into(), name.into());
        crate::names::check_mesh(&mesh).map_err(BadIdentity)?;
        crate::names::check_name(&name).map_err(BadIdentity)?;
        Ok(DataplaneId { mesh, name })
    }
}

/// Why a mesh and name cannot form a dataplane identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadIdentity(pub String);

impl fmt::Display for DataplaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.mesh, self.name)
    }
}

/// A node id that is not `<mesh>.<name>` with a valid mesh and name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadNodeId {
    /// The id as [`crate::names::shown`] shows it (escaped, cut).
    #[error("node id {0} is not of the form <mesh>.<name> (e.g. default.web-01); set node.id in the Envoy bootstrap")]
    Form(String),
    #[error("node id {id}: {why}; set node.id in the Envoy bootstrap")]
    Name { id: String, why: String },
}

impl FromStr for DataplaneId {
    type Err = BadNodeId;

    /// Splits on the first dot (Kuma's convention: the name may contain dots).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mesh, name) = s
            .split_once('.')
            .ok_or_else(|| BadNodeId::Form(crate::names::shown(s)))?;
        DataplaneId::try_new(mesh, name).map_err(|e| BadNodeId::Name {
            id: crate::names::shown(s),
            why: e.0,
        })
    }
}

/// One Envoy and the inbounds (application ports) it fronts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataplane {
    pub id: DataplaneId,
    pub address: IpAddr,
    pub inbounds: Vec<Inbound>,
    /// `networking.gateway`: a gateway dataplane (usually without inbounds).
    pub gateway: Option<GatewayType>,
    /// `networking.listeners`: a zone proxy's listeners (never probed).
    pub listeners: Vec<Listener>,
    /// `networking.admin.port`: the Envoy's admin port on its loopback.
    pub admin_port: Option<u16>,
}

/// What a dataplane is, for display: hdsd probes inbounds whatever the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataplaneKind {
    /// A sidecar next to an application (the classic shape).
    Sidecar,
    /// `networking.gateway` is set.
    Gateway,
    /// `networking.listeners` declares zone ingress / egress listeners.
    ZoneProxy,
}

impl DataplaneKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DataplaneKind::Sidecar => "sidecar",
            DataplaneKind::Gateway => "gateway",
            DataplaneKind::ZoneProxy => "zone_proxy",
        }
    }
}

impl Dataplane {
    pub fn kind(&self) -> DataplaneKind {
        if !self.listeners.is_empty() {
            DataplaneKind::ZoneProxy
        } else if self.gateway.is_some() {
            DataplaneKind::Gateway
        } else {
            DataplaneKind::Sidecar
        }
    }
}

/// `networking.gateway.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayType {
    Delegated,
    Builtin,
}

/// One entry of `networking.listeners` (a mesh-scoped zone proxy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    /// `ZoneIngress` or `ZoneEgress`.
    #[serde(rename = "type")]
    pub kind: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `networking.inbound[].state`, as the user declared it.
///
/// - `Ready` (the default): probed; ready when its checks pass.
/// - `NotReady`: still probed (the status shows what Envoy sees), but the
///   inbound reads not ready whatever the reports say.
/// - `Ignored`: not probed and left out of readiness: the API shows its
///   status as `ignored` and it never holds its dataplane back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub enum InboundState {
    #[default]
    Ready,
    NotReady,
    Ignored,
}

impl InboundState {
    /// Kuma's names, in the order of the proto enum's numbers.
    pub(super) const NAMES: [&'static str; 3] = ["Ready", "NotReady", "Ignored"];

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    pub fn is_default(&self) -> bool {
        *self == InboundState::Ready
    }
}

/// One application port behind the dataplane's Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// Envoy's public port for this inbound.
    pub port: u16,
    /// The inbound's own address (defaults to `networking.address`).
    pub address: IpAddr,
    /// Where the application listens: the probe target.
    pub service_address: IpAddr,
    pub service_port: u16,
    pub tags: BTreeMap<String, String>,
    /// Per-inbound overrides of the check defaults, from `serviceProbe`.
    pub probe: Option<ProbeOverrides>,
    /// Kuma's `name`: another way to refer to this port.
    pub name: Option<String>,
    /// Kuma's `state`: `Ignored` inbounds are not probed.
    pub state: InboundState,
}

/// The fields of `serviceProbe`; unset fields take the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ProbeOverrides {
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub no_traffic_interval: Option<Duration>,
    pub healthy_threshold: Option<u32>,
    pub unhealthy_threshold: Option<u32>,
    /// `http:`, `grpc:` or `tcp:`; unset: the server's default check (`hds.check.kind`).
    pub check: Option<Check>,
    /// Probe this port instead of `servicePort`.
    pub port: Option<u16>,
    /// Probe this address instead of `serviceAddress`.
    pub address: Option<IpAddr>,
}

impl ProbeOverrides {
    /// The effective settings: overrides on top of `defaults`. A `serviceProbe`
    /// that sets `interval` but not `noTrafficInterval` gets its own interval
    /// as the no-traffic interval.
    pub fn apply(&self, defaults: &ProbeSettings) -> ProbeSettings {
        let interval = self.interval.unwrap_or(defaults.interval);
        ProbeSettings {
            interval,
            timeout: self.timeout.unwrap_or(defaults.timeout),
            no_traffic_interval: self.no_traffic_interval.unwrap_or(match self.interval {
                Some(i) => i,
                None => defaults.no_traffic_interval,
            }),
            healthy_threshold: self.healthy_threshold.unwrap_or(defaults.healthy_threshold),
            unhealthy_threshold: self
                .unhealthy_threshold
                .unwrap_or(defaults.unhealthy_threshold),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_splits_on_first_dot() {
        let id: DataplaneId = "default.web.eu-1".parse().unwrap();
        assert_eq!(
            (id.mesh.as_str(), id.name.as_str()),
            ("default", "web.eu-1")
        );
        for bad in ["", "default", "default.", ".web", "Def.web"] {
            assert!(bad.parse::<DataplaneId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn identity_from_parts_is_validated() {
        let id = DataplaneId::try_new("default", "web.eu-1").unwrap();
        assert_eq!(id.to_string(), "default.web.eu-1");
        assert_eq!(id, "default.web.eu-1".parse().unwrap());
        for (mesh, name, why) in [
            ("", "web", "mesh must not be empty"),
            ("de.fault", "web", "contains '.'"),
            ("Default", "web", "contains 'D'"),
            ("default", "", "name must not be empty"),
            ("default", "victim\tfake-host/1", "contains '\\t'"),
            ("default", "Web", "contains 'W'"),
        ] {
            let e = DataplaneId::try_new(mesh, name).unwrap_err();
            assert!(e.to_string().contains(why), "{mesh}.{name}: {e}");
        }
    }

    #[test]
    fn overrides_apply_on_defaults() {
        let d = ProbeSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            no_traffic_interval: Duration::from_secs(3),
            healthy_threshold: 1,
            unhealthy_threshold: 2,
        };
        assert_eq!(ProbeOverrides::default().apply(&d), d);
        let o = ProbeOverrides {
            interval: Some(Duration::from_secs(5)),
            unhealthy_threshold: Some(4),
            ..Default::default()
        };
        let s = o.apply(&d);
        assert_eq!(s.no_traffic_interval, Duration::from_secs(5));
        assert_eq!(s.unhealthy_threshold, 4);
        assert_eq!(s.timeout, Duration::from_secs(1));
    }
}
