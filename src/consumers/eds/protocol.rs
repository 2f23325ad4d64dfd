//! The state-of-the-world EDS protocol of one stream, as a state machine:
//! requests and new assignments in, responses out. No network, no clock.
//!
//! - The first request names the resources (`<mesh>/<service>`); a wildcard
//!   subscription (no names on the first request, or `*`) is refused.
//! - Every response carries `version_info` (the assignments' revision, with
//!   the process's epoch) and a fresh nonce.
//! - A response carries only the subscribed resources the client does not
//!   have at their current version: every one of them on a new stream, the
//!   newly subscribed ones when the names change, the changed ones on a push.
//!   For `ClusterLoadAssignment` (unlike `Listener` and `Cluster`) this is
//!   the xDS protocol's rule: a resource left out of a response is unchanged,
//!   not removed. A push for one flip costs that service, not every service
//!   the client follows.
//! - A request whose `response_nonce` is not the last one sent is stale and
//!   ignored (its answer is on the wire already).
//! - A request with the last nonce ACKs (no `error_detail`) or NACKs it. A
//!   NACK is reported and not answered: the next change is pushed as usual,
//!   never the same response again in a loop.
//! - Names that are no longer subscribed need no answer (the client forgets
//!   them itself); a change in the assignments is pushed only when a
//!   subscribed resource changed.
//! - The machine keeps, per subscribed name, its parsed service and the
//!   version last sent, nothing per response: a client that never ACKs costs
//!   no more than one that does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::bytes::BufMut;

use super::assignment::ServiceKey;
use super::index::{Assignments, Published};

/// One `DiscoveryRequest` of a `StreamEndpoints` stream.
#[derive(Debug, Clone, PartialEq)]
pub struct EdsRequest {
    /// The request; `resource_names` is left empty when `same_names`.
    pub request: DiscoveryRequest,
    /// The request named exactly the resources of the stream's previous
    /// request, in the same order.
    pub same_names: bool,
}

impl From<DiscoveryRequest> for EdsRequest {
    fn from(request: DiscoveryRequest) -> Self {
        EdsRequest {
            request,
            same_names: false,
        }
    }
}

pub use super::assignment::TYPE_URL;

/// A request hdsd does not serve: the stream ends with INVALID_ARGUMENT.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("wildcard EDS subscriptions are not supported: name the ClusterLoadAssignments you want as <mesh>/<service> (e.g. default/web), e.g. with eds_cluster_config.service_name")]
    Wildcard,
    #[error("this is the EndpointDiscoveryService: type_url {} is not {TYPE_URL}", crate::names::shown(.0))]
    TypeUrl(String),
}

/// A response as a stream sends it: the assignments as the index encoded
/// them once for every stream, so a push to each of many subscribers copies
/// bytes instead of building and encoding the message again.
#[derive(Debug, Clone, PartialEq)]
pub struct Push {
    pub version_info: String,
    pub nonce: String,
    pub resources: Vec<Arc<Published>>,
    /// The front's zone (`node.locality.zone`): its own zone's endpoints
    /// come first (priority 0).
    pub front_zone: Option<Arc<str>>,
}

impl Push {
    /// The `DiscoveryResponse` this is.
    pub fn message(&self) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: self.version_info.clone(),
            resources: self
                .resources
                .iter()
                .map(|p| p.for_front(self.front_zone.as_ref()).0)
                .collect(),
            type_url: TYPE_URL.to_string(),
            nonce: self.nonce.clone(),
            ..Default::default()
        }
    }

    /// Writes the encoding of [`Push::message`] (the same bytes, fields in
    /// field order as prost writes them) without building it.
    pub fn encode(&self, buf: &mut impl BufMut) {
        use prost::encoding::{encode_key, encode_varint, string, WireType};
        // DiscoveryResponse: version_info 1, resources 2, type_url 4, nonce 5.
        if !self.version_info.is_empty() {
            string::encode(1, &self.version_info, buf);
        }
        for resource in &self.resources {
            encode_key(2, WireType::LengthDelimited, buf);
            let encoded = resource.encoded_for(self.front_zone.as_ref());
            encode_varint(encoded.len() as u64, buf);
            buf.put_slice(&encoded);
        }
        string::encode(4, &TYPE_URL.to_string(), buf);
        if !self.nonce.is_empty() {
            string::encode(5, &self.nonce, buf);
        }
    }
}

/// What the stream must do after an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this response. `unknown` lists newly subscribed names that match
    /// no service (served empty), for a debug log.
    Send {
        response: Push,
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

/// A subscribed resource name.
#[derive(Debug)]
struct Subscription {
    /// The service it names; `None` for a name that is not `<mesh>/<service>`
    /// (served as an empty assignment, like an unknown service).
    key: Option<ServiceKey>,
    /// The version last sent; `None` before it was sent on this stream.
    sent: Option<u64>,
}

/// One stream's state.
#[derive(Debug, Default)]
pub struct EdsStream {
    subscribed: BTreeMap<String, Subscription>,
    /// The last nonce sent; 0 before the first response.
    nonce: u64,
    /// The assignments' revision at which every subscribed resource was
    /// last brought up to date.
    seen: u64,
    started: bool,
    /// The last version the client ACKed.
    acked: Option<String>,
    /// The front's zone, from the first request that names one.
    front_zone: Option<Arc<str>>,
}

impl EdsStream {
    pub fn new() -> EdsStream {
        EdsStream::default()
    }

    /// The subscribed resource names, sorted.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.subscribed.keys().map(String::as_str)
    }

    pub fn acked(&self) -> Option<&str> {
        self.acked.as_deref()
    }

    /// How many resource names the stream remembers (its memory, in entries).
    pub fn remembered(&self) -> usize {
        self.subscribed.len()
    }

    /// A request from the client.
    pub fn on_request(
        &mut self,
        request: &DiscoveryRequest,
        current: &Assignments,
    ) -> Result<Vec<Action>, ProtocolError> {
        self.on_request_with(request, false, current)
    }

    /// A request from the client, with `same_names` when the transport saw
    /// that it names exactly the resources of the previous request (Envoy's
    /// ACKs repeat them; `request.resource_names` may then be left empty).
    pub fn on_request_with(
        &mut self,
        request: &DiscoveryRequest,
        same_names: bool,
        current: &Assignments,
    ) -> Result<Vec<Action>, ProtocolError> {
        if !request.type_url.is_empty() && request.type_url != TYPE_URL {
            return Err(ProtocolError::TypeUrl(request.type_url.clone()));
        }
        if self.front_zone.is_none() {
            self.front_zone = request
                .node
                .as_ref()
                .and_then(|n| n.locality.as_ref())
                .filter(|l| !l.zone.is_empty())
                .map(|l| Arc::from(l.zone.as_str()));
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
        self.started = true;
        if !same_names && !self.same_names(&request.resource_names) {
            let mut previous = std::mem::take(&mut self.subscribed);
            let mut unknown = Vec::new();
            for name in &request.resource_names {
                if self.subscribed.contains_key(name) {
                    continue; // named twice
                }
                let subscription = previous.remove(name).unwrap_or_else(|| {
                    let key = ServiceKey::parse(name);
                    if current.version_of(key.as_ref()) == 0 {
                        unknown.push(name.clone());
                    }
                    Subscription { key, sent: None }
                });
                self.subscribed.insert(name.clone(), subscription);
            }
            if let Some(response) = self.respond(current) {
                actions.push(Action::Send { response, unknown });
            }
        }
        Ok(actions)
    }

    /// Whether `names` (in any order, repeats allowed) are the names subscribed.
    fn same_names(&self, names: &[String]) -> bool {
        let names: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        names.len() == self.subscribed.len()
            && names.iter().all(|n| self.subscribed.contains_key(*n))
    }

    /// New assignments: a response when a subscribed resource changed.
    /// Costs the services that changed since the stream last looked (read
    /// from the assignments' recent changes), not every service it follows.
    pub fn on_change(&mut self, current: &Assignments) -> Option<Push> {
        if !self.started || current.revision == self.seen {
            return None;
        }
        let Some(changed) = current.changed_since(self.seen) else {
            return self.respond(current); // too far behind: look at each
        };
        let mut resources = Vec::new();
        for key in changed {
            let name = key.to_string();
            if let Some(subscription) = self.subscribed.get_mut(&name) {
                update(&name, subscription, current, &mut resources);
            }
        }
        self.seen = current.revision;
        self.response(current, resources)
    }

    /// A response with every subscribed resource, whether or not the client
    /// has it (`eds.endpoint_stale_after`: only a received assignment resets
    /// a front's stale timer); `None` before the first request.
    pub fn refresh(&mut self, current: &Assignments) -> Option<Push> {
        if !self.started {
            return None;
        }
        for subscription in self.subscribed.values_mut() {
            subscription.sent = None;
        }
        self.respond(current)
    }

    /// A response with every subscribed resource the client does not have
    /// at its current version; `None` when it has them all.
    fn respond(&mut self, current: &Assignments) -> Option<Push> {
        let mut resources = Vec::new();
        for (name, subscription) in &mut self.subscribed {
            update(name, subscription, current, &mut resources);
        }
        self.seen = current.revision;
        self.response(current, resources)
    }

    fn response(&mut self, current: &Assignments, resources: Vec<Arc<Published>>) -> Option<Push> {
        if resources.is_empty() {
            return None;
        }
        self.nonce += 1;
        Some(Push {
            version_info: format!("{}.{}", current.epoch, current.revision),
            resources,
            nonce: self.nonce.to_string(),
            front_zone: self.front_zone.clone(),
        })
    }
}

/// Adds `subscription`'s resource to `resources` unless the client has it
/// at its current version.
fn update(
    name: &str,
    subscription: &mut Subscription,
    current: &Assignments,
    resources: &mut Vec<Arc<Published>>,
) {
    let published = subscription
        .key
        .as_ref()
        .and_then(|k| current.services.get(k));
    let version = published.map_or(0, |p| p.version);
    if subscription.sent == Some(version) {
        return;
    }
    subscription.sent = Some(version);
    resources.push(match published {
        Some(p) => p.clone(),
        None => Arc::new(Published::new(0, name, Vec::new())),
    });
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use prost::Message as _;

    use super::*;
    use crate::consumers::eds::assignment::{EdsHealth, Endpoint};
    use crate::consumers::eds::index::Published;

    /// Assignments at `revision` with `web` (version `web_version`, `n` endpoints).
    pub(in crate::consumers::eds) fn assignments(
        revision: u64,
        services: &[(&str, u64, u16)],
    ) -> Assignments {
        Assignments {
            epoch: 42,
            revision,
            synced: true,
            // No recent changes kept: a stream behind reads each service.
            recent: Default::default(),
            recent_floor: revision,
            services: services
                .iter()
                .map(|(name, version, n)| {
                    let key = ServiceKey::new("default", *name);
                    let endpoints: Vec<Endpoint> = (0..*n)
                        .map(|i| Endpoint {
                            zone: None,
                            address: "127.0.0.1".parse().unwrap(),
                            port: 8000 + i,
                            health: EdsHealth::Healthy,
                        })
                        .collect();
                    let published = Published::new(*version, &key.to_string(), endpoints);
                    (key, Arc::new(published))
                })
                .collect(),
        }
    }

    pub(in crate::consumers::eds) fn request(
        names: &[&str],
        version: &str,
        nonce: &str,
    ) -> DiscoveryRequest {
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

    fn sent(actions: &[Action]) -> Vec<&Push> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { response, .. } => Some(response),
                _ => None,
            })
            .collect()
    }

    fn decoded(r: &Push) -> Vec<(String, usize)> {
        r.message()
            .resources
            .iter()
            .map(|any| {
                assert_eq!(any.type_url, TYPE_URL);
                let cla = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
                let n = cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum();
                (cla.cluster_name, n)
            })
            .collect()
    }

    /// A refresh (`eds.endpoint_stale_after`) re-sends every subscribed
    /// resource at its current version with a new nonce, and the ACK of it
    /// is an ACK like any other; nothing before the first request.
    #[test]
    fn a_refresh_resends_every_subscribed_resource() {
        let current = assignments(3, &[("web", 2, 1), ("api", 3, 2), ("db", 1, 1)]);
        let mut s = EdsStream::new();
        assert!(s.refresh(&current).is_none());
        let first = s
            .on_request(&request(&["default/web", "default/api"], "", ""), &current)
            .unwrap();
        let first = sent(&first)[0].clone();
        let again = s.refresh(&current).unwrap();
        assert_eq!(again.version_info, first.version_info);
        assert_ne!(again.nonce, first.nonce);
        let mut names = decoded(&again);
        names.sort();
        assert_eq!(
            names,
            [
                ("default/api".to_string(), 2),
                ("default/web".to_string(), 1)
            ]
        );
        let ack = s
            .on_request(
                &request(
                    &["default/web", "default/api"],
                    &again.version_info,
                    &again.nonce,
                ),
                &current,
            )
            .unwrap();
        assert_eq!(
            ack,
            [Action::Ack {
                version: again.version_info.clone()
            }]
        );
        // Up to date after the refresh: no change, nothing to push.
        assert!(s.on_change(&current).is_none());
    }

    /// A push is written as the bytes prost writes for its message, and a
    /// client decodes it into the same message.
    #[test]
    fn a_push_encodes_to_the_bytes_of_its_message() {
        let a = assignments(3, &[("web", 2, 3), ("api", 1, 0)]);
        let mut s = EdsStream::new();
        let actions = s
            .on_request(
                &request(&["default/web", "default/api", "default/nope"], "", ""),
                &a,
            )
            .unwrap();
        let push = sent(&actions)[0];
        assert_eq!(push.resources.len(), 3);
        let mut bytes = Vec::new();
        push.encode(&mut bytes);
        let message = push.message();
        assert_eq!(bytes, message.encode_to_vec());
        assert_eq!(DiscoveryResponse::decode(&bytes[..]).unwrap(), message);
        // Empty strings are left out, as prost leaves them out.
        let empty = Push {
            version_info: String::new(),
            nonce: String::new(),
            resources: Vec::new(),
            front_zone: None,
        };
        let mut bytes = Vec::new();
        empty.encode(&mut bytes);
        assert_eq!(bytes, empty.message().encode_to_vec());
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
        assert_eq!(response.message().type_url, TYPE_URL);
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
    fn subscription_changes_are_answered_at_once_with_what_the_client_lacks() {
        let mut s = EdsStream::new();
        let a = assignments(3, &[("web", 3, 1), ("api", 2, 2)]);
        s.on_request(&request(&["default/web"], "", ""), &a)
            .unwrap();
        let acted = s
            .on_request(&request(&["default/web", "default/api"], "42.3", "1"), &a)
            .unwrap();
        assert!(matches!(acted[0], Action::Ack { .. }));
        // Only the new name: the client has web at this version already.
        let r = sent(&acted);
        assert_eq!(decoded(r[0]), [("default/api".into(), 2)]);
        assert_eq!(r[0].nonce, "2");
        // The same names in another order, repeated: nothing to send.
        let acted = s
            .on_request(
                &request(&["default/api", "default/web", "default/api"], "42.3", "2"),
                &a,
            )
            .unwrap();
        assert!(sent(&acted).is_empty());
        // Unsubscribe from web: nothing to send (the client forgets it), and
        // web's changes no longer push.
        let acted = s
            .on_request(&request(&["default/api"], "42.3", "2"), &a)
            .unwrap();
        assert!(sent(&acted).is_empty());
        assert_eq!(s.names().collect::<Vec<_>>(), ["default/api"]);
        assert!(s
            .on_change(&assignments(4, &[("web", 4, 5), ("api", 2, 2)]))
            .is_none());
        // Subscribed to web again: sent again, at its current version.
        let acted = s
            .on_request(&request(&["default/api", "default/web"], "42.3", "2"), &a)
            .unwrap();
        assert_eq!(decoded(sent(&acted)[0]), [("default/web".into(), 1)]);
        // Unsubscribe from everything: nothing to send, nothing pushed.
        let acted = s.on_request(&request(&[], "42.3", "3"), &a).unwrap();
        assert!(sent(&acted).is_empty());
        assert!(s.on_change(&assignments(5, &[("api", 5, 1)])).is_none());
    }

    /// A push carries the subscribed resources that changed, not every one.
    #[test]
    fn a_push_carries_only_what_changed() {
        let mut s = EdsStream::new();
        let a = assignments(3, &[("web", 3, 1), ("api", 2, 2), ("db", 1, 3)]);
        let first = s
            .on_request(
                &request(&["default/web", "default/api", "default/db"], "", ""),
                &a,
            )
            .unwrap();
        assert_eq!(decoded(sent(&first)[0]).len(), 3);
        let r = s
            .on_change(&assignments(
                4,
                &[("web", 3, 1), ("api", 4, 1), ("db", 1, 3)],
            ))
            .unwrap();
        assert_eq!(decoded(&r), [("default/api".into(), 1)]);
        assert_eq!(r.version_info, "42.4");
        // Two changed (db lost its endpoints): both, nothing else.
        let r = s
            .on_change(&assignments(5, &[("web", 5, 2), ("api", 4, 1)]))
            .unwrap();
        assert_eq!(
            decoded(&r),
            [("default/db".into(), 0), ("default/web".into(), 2)]
        );
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

    /// An ACK the transport saw repeat the names (sent without them) is an
    /// ACK: nothing is unsubscribed, nothing is sent again.
    #[test]
    fn an_ack_with_the_same_names_left_out_keeps_the_subscription() {
        let mut s = EdsStream::new();
        let a = assignments(1, &[("web", 1, 1), ("api", 1, 1)]);
        let first = s
            .on_request(&request(&["default/web", "default/api"], "", ""), &a)
            .unwrap();
        let Action::Send { response, .. } = &first[0] else {
            panic!("a response first: {first:?}")
        };
        let ack = request(&[], &response.version_info, &response.nonce);
        let actions = s.on_request_with(&ack, true, &a).unwrap();
        assert!(matches!(&actions[..], [Action::Ack { .. }]), "{actions:?}");
        assert_eq!(s.acked(), Some(response.version_info.as_str()));
        assert_eq!(
            s.names().collect::<Vec<_>>(),
            ["default/api", "default/web"]
        );
        // The next change is pushed for both names, as before.
        let b = assignments(2, &[("web", 2, 2), ("api", 2, 2)]);
        assert_eq!(s.on_change(&b).unwrap().resources.len(), 2);
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
            assert_eq!(s.remembered(), 2);
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
