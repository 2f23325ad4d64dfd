//! The operator's word on an inbound: what holds it not ready whatever its
//! checks say, and the one rule that folds it with the checks' status.
//!
//! Every reader applies the word through [`ready`] and EDS through
//! `consumers::eds::assignment::health_of`, so the API, the watch, the
//! page, `hdsd status`, a global and the endpoints a front Envoy routes to
//! never disagree. The word is shown beside health, never instead of it:
//! the probes keep running and the status says what the Envoy sees.
//!
//! Today the one word is a declared `state: NotReady` (Kuma's format); an
//! operator's maintenance is meant to be the second kind, through the same
//! functions. A zone sends the word to the global with each inbound
//! (`hdsd.v1.Inbound.operator_word`); [`OperatorWord::of_remote`] reads it,
//! and reads the word of a zone of an older release, which does not send
//! it, from its readiness.

use serde::{Deserialize, Serialize};

use crate::dataplane::{Inbound, InboundState};
use crate::pb;
use crate::readiness::Status;

/// Why an operator holds an inbound not ready. Serialised as an object
/// with its `kind` (`{"kind": "declared_not_ready"}`), so that a kind with
/// more to say (a reason, an author, an end) adds fields, not a new shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OperatorWord {
    /// The dataplane's definition declares the inbound `state: NotReady`.
    DeclaredNotReady,
    /// A zone holds the inbound not ready for a reason this release does
    /// not know (a kind of a newer release): it is held all the same.
    Unknown,
}

/// The reason code of [`OperatorWord::DeclaredNotReady`], as the API shows
/// it (and as a zone of an older release sends it).
pub const DECLARED_NOT_READY: &str = "declared_not_ready";

impl OperatorWord {
    /// The word of one of this hdsd's own inbounds, from its definition.
    pub fn of_inbound(inbound: &Inbound) -> Option<OperatorWord> {
        (inbound.state == InboundState::NotReady).then_some(OperatorWord::DeclaredNotReady)
    }

    /// The word of an inbound of another zone, as its zone sent it. A zone
    /// of an older release sends no word, but its readiness says it: its
    /// reason `declared_not_ready`, or `ready: false` while its status says
    /// the checks pass (nothing but an operator's word does that).
    pub fn of_remote(inbound: &pb::Inbound) -> Option<OperatorWord> {
        match pb::OperatorWord::try_from(inbound.operator_word) {
            Ok(pb::OperatorWord::DeclaredNotReady) => Some(OperatorWord::DeclaredNotReady),
            Err(_) => Some(OperatorWord::Unknown),
            Ok(pb::OperatorWord::Unspecified) => {
                let health = inbound.health.as_ref()?;
                if health.ready {
                    None
                } else if health
                    .reason
                    .as_ref()
                    .is_some_and(|r| r.code == DECLARED_NOT_READY)
                {
                    Some(OperatorWord::DeclaredNotReady)
                } else if matches!(
                    pb::Status::try_from(health.status),
                    Ok(pb::Status::Healthy | pb::Status::NotProbed)
                ) {
                    Some(OperatorWord::Unknown)
                } else {
                    None
                }
            }
        }
    }

    /// The word as the zone protocol and the gRPC API carry it.
    pub fn to_pb(&self) -> pb::OperatorWord {
        match self {
            OperatorWord::DeclaredNotReady => pb::OperatorWord::DeclaredNotReady,
            // Not re-sent as a word: the `ready: false` beside it carries it
            // (see `of_remote`).
            OperatorWord::Unknown => pb::OperatorWord::Unspecified,
        }
    }

    /// A stable word for programs: the reason code the API shows.
    pub fn code(&self) -> &'static str {
        match self {
            OperatorWord::DeclaredNotReady => DECLARED_NOT_READY,
            OperatorWord::Unknown => "operator_word_unknown",
        }
    }

    /// What it means and how to end it, for people.
    pub fn message(&self) -> &'static str {
        match self {
            OperatorWord::DeclaredNotReady => "the dataplane's definition declares this inbound `state: NotReady`: it is not ready and gets no traffic whatever Envoy reports; change the definition to make it ready",
            OperatorWord::Unknown => "its zone holds this inbound not ready for a reason this hdsd's release does not know (a zone of a newer release): it gets no traffic; upgrade this hdsd to see why",
        }
    }
}

/// Whether an inbound is ready: its checks pass and no operator's word
/// holds it. The one rule of readiness every reader applies.
pub fn ready(word: Option<&OperatorWord>, status: Status) -> bool {
    word.is_none() && status.is_ready()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(word: i32, ready: bool, status: pb::Status, reason: Option<&str>) -> pb::Inbound {
        pb::Inbound {
            operator_word: word,
            health: Some(pb::Health {
                ready,
                status: status as i32,
                reason: reason.map(|code| pb::Reason {
                    code: code.into(),
                    message: String::new(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_word_holds_an_inbound_whose_checks_pass() {
        for status in Status::ALL {
            assert_eq!(ready(None, status), status.is_ready(), "{status:?}");
            for word in [OperatorWord::DeclaredNotReady, OperatorWord::Unknown] {
                assert!(!ready(Some(&word), status), "{word:?} {status:?}");
            }
        }
    }

    #[test]
    fn a_declared_not_ready_inbound_has_the_word_the_others_none() {
        let text = "type: Dataplane\nmesh: shop\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n  - port: 10002\n    servicePort: 9090\n    state: NotReady\n  - port: 10003\n    servicePort: 9091\n    state: Ignored\n";
        let dp = crate::dataplane::parse_documents(text).unwrap().remove(0);
        let words: Vec<_> = dp.inbounds.iter().map(OperatorWord::of_inbound).collect();
        assert_eq!(words, [None, Some(OperatorWord::DeclaredNotReady), None]);
    }

    #[test]
    fn the_remote_word_is_read_from_the_field_and_from_an_older_zone_s_readiness() {
        use pb::Status as P;
        let declared = pb::OperatorWord::DeclaredNotReady as i32;
        let cases = [
            // This release's zone: the field says it.
            (
                remote(declared, false, P::Healthy, None),
                Some(OperatorWord::DeclaredNotReady),
            ),
            // A newer zone's kind: held all the same.
            (
                remote(7, false, P::Healthy, None),
                Some(OperatorWord::Unknown),
            ),
            // An older zone: no field, its reason says it.
            (
                remote(0, false, P::Healthy, Some(DECLARED_NOT_READY)),
                Some(OperatorWord::DeclaredNotReady),
            ),
            (
                remote(0, false, P::Unhealthy, Some(DECLARED_NOT_READY)),
                Some(OperatorWord::DeclaredNotReady),
            ),
            // Not ready with passing checks and no reason: held by a word unknown here.
            (
                remote(0, false, P::NotProbed, None),
                Some(OperatorWord::Unknown),
            ),
            // No word: the checks decide.
            (remote(0, true, P::Healthy, None), None),
            (remote(0, false, P::Unhealthy, None), None),
            (remote(0, false, P::Stale, None), None),
        ];
        for (inbound, want) in cases {
            assert_eq!(OperatorWord::of_remote(&inbound), want, "{inbound:?}");
        }
        // What this release sends, it reads back.
        let sent = OperatorWord::DeclaredNotReady.to_pb() as i32;
        assert_eq!(
            OperatorWord::of_remote(&remote(sent, false, P::Healthy, None)),
            Some(OperatorWord::DeclaredNotReady)
        );
    }

    #[test]
    fn the_word_serialises_as_an_object_with_its_kind() {
        let json = serde_json::to_string(&OperatorWord::DeclaredNotReady).unwrap();
        assert_eq!(json, r#"{"kind":"declared_not_ready"}"#);
        let back: OperatorWord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, OperatorWord::DeclaredNotReady);
    }
}
