//! The state-of-the-world EDS protocol of one stream, as a state machine:
//! requests and new assignments in, responses out. No network, no clock.
//!
//! - The first request names the resources (`<mesh>/<service>`); a wildcard
//!   subscription (no names on the first request, or `*`) is refused.
//! - Every response carries `version_info` (the assignments' revision, with
//!   the process's epoch) and a fresh nonce, and every subscribed resource.
//! - A request whose `response_nonce` is not the last one sent is stale and
//!   ignored (its answer is on the wire already).
//! - A request with the last nonce ACKs (no `error_detail`) or NACKs it. A
//!   NACK is reported and not answered: the next change is pushed as usual,
//!   never the same response again in a loop.
//! - A change in the names subscribed is answered at once; a change in the
//!   assignments is pushed only when a subscribed resource changed.
//! - The machine keeps the names and the versions last sent, nothing per
//!   response: a client that never ACKs costs no more than one that does.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use super::assignment::ServiceKey;
use super::index::{encode, Assignments};

/// The type of every resource EDS serves.
pub const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// A request hdsd does not serve: the stream ends with INVALID_ARGUMENT.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("wildcard EDS subscriptions are not supported: name the ClusterLoadAssignments you want as <mesh>/<service> (e.g. default/web), e.g. with eds_cluster_config.service_name")]
    Wildcard,
    #[error("this is the EndpointDiscoveryService: type_url {0:?} is not {TYPE_URL}")]
    TypeUrl(String),
}

/// What the stream must do after an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this response. `unknown` lists newly subscribed names that match
    /// no service (served empty), for a debug log.
    Send {
        response: DiscoveryResponse,
        unknown: Vec<String>,
    },
    /// The client accepted `version`.
    Ack { version: String },
    /// The client rejected the response with `nonce`: log and count it.
    Nack {
        version: String,
        nonce: String,
        message: String,
    },
}

/// One stream's state.
#[derive(Debug, Default)]
pub struct EdsStream {
    names: BTreeSet<String>,
    /// The last nonce sent; 0 before the first response.
    nonce: u64,
    /// The version of each resource in the last response.
    sent: BTreeMap<String, u64>,
    started: bool,
    /// The last version the client ACKed.
    acked: Option<String>,
}

impl EdsStream {
    pub fn new() -> EdsStream {
        EdsStream::default()
    }

    /// The subscribed resource names.
    pub fn names(&self) -> &BTreeSet<String> {
        &self.names
    }

    pub fn acked(&self) -> Option<&str> {
        self.acked.as_deref()
    }

    /// How many resource versions the stream remembers (its memory, in entries).
    pub fn remembered(&self) -> usize {
        self.names.len() + self.sent.len()
    }

    /// A request from the client.
    pub fn on_request(
        &mut self,
        request: &DiscoveryRequest,
        current: &Assignments,
    ) -> Result<Vec<Action>, ProtocolError> {
        if !request.type_url.is_empty() && request.type_url != TYPE_URL {
            return Err(ProtocolError::TypeUrl(request.type_url.clone()));
        }
        let mut actions = Vec::new();
        if !request.response_nonce.is_empty() {
            if request.response_nonce != self.nonce.to_string() {
                return Ok(actions); // stale: answered by a later response
            }
            match &request.error_detail {
                Some(error) => actions.push(Action::Nack {
                    version: request.version_info.clone(),
                    nonce: request.response_nonce.clone(),
                    message: error.message.clone(),
                }),
                None => {
                    self.acked = Some(request.version_info.clone());
                    actions.push(Action::Ack {
                        version: request.version_info.clone(),
                    });
                }
            }
        }
        if request.resource_names.iter().any(|n| n == "*")
            || (!self.started && request.resource_names.is_empty())
        {
            return Err(ProtocolError::Wildcard);
        }
        let names: BTreeSet<String> = request.resource_names.iter().cloned().collect();
        if !self.started || names != self.names {
            let added: Vec<String> = names.difference(&self.names).cloned().collect();
            self.started = true;
            self.names = names;
            self.sent.retain(|n, _| self.names.contains(n));
            if !self.names.is_empty() {
                let unknown = added
                    .into_iter()
                    .filter(|n| current.version_of(ServiceKey::parse(n).as_ref()) == 0)
                    .collect();
                actions.push(Action::Send {
                    response: self.respond(current),
                    unknown,
                });
            }
        }
        Ok(actions)
    }

    /// New assignments: a response when a subscribed resource changed.
    pub fn on_change(&mut self, current: &Assignments) -> Option<DiscoveryResponse> {
        if !self.started || self.names.is_empty() {
            return None;
        }
        let changed = self.names.iter().any(|n| {
            let version = current.version_of(ServiceKey::parse(n).as_ref());
            self.sent.get(n) != Some(&version)
        });
        changed.then(|| self.respond(current))
    }

    fn respond(&mut self, current: &Assignments) -> DiscoveryResponse {
        self.nonce += 1;
        let mut resources = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let key = ServiceKey::parse(name);
            let published = key.as_ref().and_then(|k| current.services.get(k));
            self.sent
                .insert(name.clone(), published.map_or(0, |p| p.version));
            resources.push(match published {
                Some(p) => p.resource.clone(),
                None => encode(name, &[]),
            });
        }
        DiscoveryResponse {
            version_info: format!("{}.{}", current.epoch, current.revision),
            resources,
            type_url: TYPE_URL.to_string(),
            nonce: self.nonce.to_string(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use prost::Message as _;

    use super::*;
    use crate::consumers::eds::assignment::{EdsHealth, Endpoint};
    use crate::consumers::eds::index::Published;

    /// Assignments at `revision` with `web` (version `web_version`, `n` endpoints).
    fn assignments(revision: u64, services: &[(&str, u64, u16)]) -> Assignments {
        Assignments {
            epoch: 42,
            revision,
            synced: true,
            services: services
                .iter()
                .map(|(name, version, n)| {
                    let key = ServiceKey::new("default", *name);
                    let endpoints: Vec<Endpoint> = (0..*n)
                        .map(|i| Endpoint {
                            address: "127.0.0.1".parse().unwrap(),
                            port: 8000 + i,
                            health: EdsHealth::Healthy,
                        })
                        .collect();
                    let resource = encode(&key.to_string(), &endpoints);
                    (
                        key,
                        Arc::new(Published {
                            version: *version,
                            endpoints,
                            resource,
                        }),
                    )
                })
                .collect(),
        }
    }

    fn request(names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: TYPE_URL.to_string(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: version.to_string(),
            response_nonce: nonce.to_string(),
            ..Default::default()
        }
    }

    fn nack(names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            error_detail: Some(RpcStatus {
                code: 3,
                message: "bad endpoint".into(),
                details: vec![],
            }),
            ..request(names, version, nonce)
        }
    }

    fn sent(actions: &[Action]) -> Vec<&DiscoveryResponse> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { response, .. } => Some(response),
                _ => None,
            })
            .collect()
    }

    fn decoded(r: &DiscoveryResponse) -> Vec<(String, usize)> {
        r.resources
            .iter()
            .map(|any| {
                assert_eq!(any.type_url, TYPE_URL);
                let cla = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
                let n = cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum();
                (cla.cluster_name, n)
            })
            .collect()
    }

    #[test]
    fn first_request_is_answered_with_version_nonce_and_every_named_resource() {
        let mut s = EdsStream::new();
        let a = assignments(3, &[("web", 2, 3)]);
        let actions = s
            .on_request(&request(&["default/web", "default/nope"], "", ""), &a)
            .unwrap();
        let [Action::Send { response, unknown }] = actions.as_slice() else {
            panic!("{actions:?}");
        };
        assert_eq!(response.version_info, "42.3");
        assert_eq!(response.nonce, "1");
        assert_eq!(response.type_url, TYPE_URL);
        // Sorted by name; the unknown service is an empty assignment.
        assert_eq!(
            decoded(response),
            [("default/nope".into(), 0), ("default/web".into(), 3)]
        );
        assert_eq!(unknown, &["default/nope".to_string()]);
    }

    #[test]
    fn ack_then_push_on_change_only() {
        let mut s = EdsStream::new();
        let a = assignments(3, &[("web", 2, 3), ("api", 3, 1)]);
        s.on_request(&request(&["default/web"], "", ""), &a)
            .unwrap();
        let acted = s
            .on_request(&request(&["default/web"], "42.3", "1"), &a)
            .unwrap();
        assert_eq!(
            acted,
            [Action::Ack {
                version: "42.3".into()
            }]
        );
        assert_eq!(s.acked(), Some("42.3"));
        // Another service changed: nothing to push.
        assert!(s
            .on_change(&assignments(4, &[("web", 2, 3), ("api", 4, 2)]))
            .is_none());
        // web changed: pushed, with the new version and the next nonce.
        let r = s
            .on_change(&assignments(5, &[("web", 5, 2), ("api", 4, 2)]))
            .expect("web changed");
        assert_eq!((r.version_info.as_str(), r.nonce.as_str()), ("42.5", "2"));
        assert_eq!(decoded(&r), [("default/web".into(), 2)]);
        // The same state again: nothing.
        assert!(s.on_change(&assignments(5, &[("web", 5, 2)])).is_none());
        // web lost every endpoint: pushed as an empty assignment.
        let r = s.on_change(&assignments(6, &[])).expect("web is gone");
        assert_eq!(decoded(&r), [("default/web".into(), 0)]);
    }

    #[test]
    fn a_nack_is_reported_and_not_answered_and_the_next_change_is_pushed() {
        let mut s = EdsStream::new();
        let a = assignments(3, &[("web", 3, 1)]);
        s.on_request(&request(&["default/web"], "", ""), &a)
            .unwrap();
        let acted = s.on_request(&nack(&["default/web"], "", "1"), &a).unwrap();
        assert_eq!(
            acted,
            [Action::Nack {
                version: "".into(),
                nonce: "1".into(),
                message: "bad endpoint".into()
            }]
        );
        assert_eq!(s.acked(), None);
        // Nothing changed: the rejected response is not sent again.
        assert!(s.on_change(&a).is_none());
        let r = s.on_change(&assignments(4, &[("web", 4, 2)])).unwrap();
        assert_eq!(r.nonce, "2");
    }

    #[test]
    fn stale_nonces_are_ignored() {
        let mut s = EdsStream::new();
        s.on_request(
            &request(&["default/web"], "", ""),
            &assignments(1, &[("web", 1, 1)]),
        )
        .unwrap();
        s.on_change(&assignments(2, &[("web", 2, 1)])).unwrap(); // nonce 2
                                                                 // The client's ACK of nonce 1 crosses the push of nonce 2.
        let a = assignments(2, &[("web", 2, 1)]);
        assert!(s
            .on_request(&request(&["default/web"], "42.1", "1"), &a)
            .unwrap()
            .is_empty());
        assert_eq!(s.acked(), None);
        // Even a NACK or new names with a stale nonce.
        assert!(s
            .on_request(&nack(&["default/other"], "42.1", "1"), &a)
            .unwrap()
            .is_empty());
        assert_eq!(s.names().len(), 1);
        let acted = s
            .on_request(&request(&["default/web"], "42.2", "2"), &a)
            .unwrap();
        assert_eq!(
            acted,
            [Action::Ack {
                version: "42.2".into()
            }]
        );
    }

    #[test]
    fn subscription_changes_are_answered_at_once() {
        let mut s = EdsStream::new();
        let a = assignments(3, &[("web", 3, 1), ("api", 2, 2)]);
        s.on_request(&request(&["default/web"], "", ""), &a)
            .unwrap();
        let acted = s
            .on_request(&request(&["default/web", "default/api"], "42.3", "1"), &a)
            .unwrap();
        assert!(matches!(acted[0], Action::Ack { .. }));
        let r = sent(&acted);
        assert_eq!(
            decoded(r[0]),
            [("default/api".into(), 2), ("default/web".into(), 1)]
        );
        assert_eq!(r[0].nonce, "2");
        // Unsubscribe from web: only api, and web's changes no longer push.
        let acted = s
            .on_request(&request(&["default/api"], "42.3", "2"), &a)
            .unwrap();
        assert_eq!(decoded(sent(&acted)[0]), [("default/api".into(), 2)]);
        assert!(s
            .on_change(&assignments(4, &[("web", 4, 5), ("api", 2, 2)]))
            .is_none());
        // Unsubscribe from everything: nothing to send, nothing pushed.
        let acted = s.on_request(&request(&[], "42.3", "3"), &a).unwrap();
        assert!(sent(&acted).is_empty());
        assert!(s.on_change(&assignments(5, &[("api", 5, 1)])).is_none());
    }

    #[test]
    fn wildcard_and_foreign_types_are_refused() {
        let a = assignments(1, &[]);
        assert_eq!(
            EdsStream::new().on_request(&request(&[], "", ""), &a),
            Err(ProtocolError::Wildcard)
        );
        assert_eq!(
            EdsStream::new().on_request(&request(&["*"], "", ""), &a),
            Err(ProtocolError::Wildcard)
        );
        let cds = DiscoveryRequest {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            ..request(&["default/web"], "", "")
        };
        let e = EdsStream::new().on_request(&cds, &a).unwrap_err();
        assert!(
            e.to_string().contains("envoy.config.cluster.v3.Cluster"),
            "{e}"
        );
        assert!(ProtocolError::Wildcard
            .to_string()
            .contains("<mesh>/<service>"));
    }

    /// A client that never ACKs: every change is one push, and the stream
    /// remembers no more than the names it serves.
    #[test]
    fn a_client_that_never_acks_does_not_grow_the_stream() {
        let mut s = EdsStream::new();
        s.on_request(
            &request(&["default/web", "default/api"], "", ""),
            &assignments(1, &[("web", 1, 1)]),
        )
        .unwrap();
        let mut pushes = 0;
        for revision in 2..10_000u64 {
            let a = assignments(revision, &[("web", revision, (revision % 7) as u16)]);
            if s.on_change(&a).is_some() {
                pushes += 1;
            }
            assert_eq!(s.remembered(), 4);
        }
        assert_eq!(pushes, 9_998);
        // Its late ACK of an old response is stale.
        assert!(s
            .on_request(
                &request(&["default/web", "default/api"], "42.5", "3"),
                &assignments(9_999, &[])
            )
            .unwrap()
            .is_empty());
    }
}
