//! The read model as `hdsd.v1` protobuf: the one conversion of a
//! [`DataplaneItem`] and a [`ZoneSummary`] (and the status and zone state
//! words) that the gRPC API serves and a zone's uplink sends its global.

use crate::pb;
use crate::readiness::Timestamp;
use crate::view::zones::{ZoneState, ZoneSummary};
use crate::view::{DataplaneItem, ReasonItem};

/// A zone's state word (the REST API's) as the proto enum.
pub fn zone_state_of(word: &str) -> pb::ZoneState {
    use ZoneState as Z;
    match Z::ALL.into_iter().find(|z| z.as_str() == word) {
        Some(Z::Online) => pb::ZoneState::Online,
        Some(Z::Offline) => pb::ZoneState::Offline,
        Some(Z::Disabled) => pb::ZoneState::Disabled,
        Some(Z::NeverConnected) => pb::ZoneState::NeverConnected,
        None => pb::ZoneState::Unspecified,
    }
}

/// One zone's summary as protobuf.
pub fn zone_to_pb(s: &ZoneSummary) -> pb::Zone {
    pb::Zone {
        name: s.name.clone(),
        state: zone_state_of(s.liveness.state.as_str()) as i32,
        since: s.liveness.since.map(timestamp),
        last_seen: s.liveness.last_seen.map(timestamp),
        registered: s.registered,
        instance: s.instance.clone().unwrap_or_default(),
        revision: s.held.unwrap_or(0),
        dataplanes: u32::try_from(s.dataplanes).unwrap_or(u32::MAX),
        inbounds_ready: u32::try_from(s.inbounds_ready).unwrap_or(u32::MAX),
        inbounds_total: u32::try_from(s.inbounds_total).unwrap_or(u32::MAX),
        withdrawn: s.withdrawn,
        streams: s.counters.streams,
        resumes: s.counters.resumes,
        snapshots: s.counters.snapshots,
    }
}

pub fn timestamp(t: Timestamp) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// The REST status word as the proto enum (the same names, 1:1).
pub fn status_of(word: &str) -> pb::Status {
    use crate::readiness::Status as S;
    match crate::readiness::Status::from_name(word) {
        Some(S::Pending) => pb::Status::Pending,
        Some(S::Healthy) => pb::Status::Healthy,
        Some(S::Unhealthy) => pb::Status::Unhealthy,
        Some(S::Timeout) => pb::Status::Timeout,
        Some(S::Draining) => pb::Status::Draining,
        Some(S::Degraded) => pb::Status::Degraded,
        Some(S::Unknown) => pb::Status::Unknown,
        Some(S::NotProbed) => pb::Status::NotProbed,
        Some(S::Stale) => pb::Status::Stale,
        Some(S::Unsupported) => pb::Status::Unsupported,
        None => pb::Status::Unspecified,
    }
}

fn reason(r: &ReasonItem) -> pb::Reason {
    pb::Reason {
        code: r.code.clone(),
        message: r.message.clone(),
    }
}

/// The REST item as protobuf, with its revision.
pub fn to_pb(item: &DataplaneItem, revision: u64) -> pb::Dataplane {
    pb::Dataplane {
        mesh: item.mesh.clone(),
        name: item.name.clone(),
        address: item.address.to_string(),
        connection: Some(pb::Connection {
            connected: item.connection.connected,
            connected_at: item.connection.connected_at.map(timestamp),
            last_report_at: item.connection.last_report_at.map(timestamp),
            envoy_version: item.connection.envoy_version.clone().unwrap_or_default(),
            held_by: item.connection.held_by.clone().unwrap_or_default(),
            problem: item.connection.problem.as_ref().map(reason),
        }),
        inbounds: item
            .inbounds
            .iter()
            .map(|i| pb::Inbound {
                port: u32::from(i.port),
                service_port: u32::from(i.service_port),
                service_address: i.service_address.to_string(),
                tags: i.tags.clone().into_iter().collect(),
                health: Some(pb::Health {
                    ready: i.health.ready,
                    status: status_of(&i.health.status) as i32,
                    since: Some(timestamp(i.health.since)),
                    last_report_at: i.health.last_report_at.map(timestamp),
                    reason: i.health.reason.as_ref().map(reason),
                }),
                // The REST item has no inbound address: the zone's uplink
                // sets it from the definition.
                address: String::new(),
                operator_word: i
                    .operator_word
                    .as_ref()
                    .map_or(pb::OperatorWord::Unspecified, |w| w.to_pb())
                    as i32,
            })
            .collect(),
        revision,
        ready: item.is_ready(),
        zone: item.zone.as_ref().map(|z| pb::ZoneOf {
            name: z.name.clone(),
            state: zone_state_of(&z.state) as i32,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rest_status_word_has_its_proto_value() {
        for s in crate::readiness::Status::ALL {
            let v = status_of(s.as_str());
            assert_ne!(v, pb::Status::Unspecified, "{s:?}");
            // The proto names are the REST words, upper-cased, with a prefix.
            assert_eq!(
                v.as_str_name(),
                format!("STATUS_{}", s.as_str().to_uppercase())
            );
        }
    }
}
