//! Whether a zone is online, from the global's own times.
//!
//! The rule: a zone is offline when `now - max(last heartbeat, stream
//! opened) > zone_timeout`. Every time is taken on the global's clock when a
//! stream is accepted or a message arrives: the zone's clock is never read,
//! so a zone whose clock is off by hours is judged like any other. A zone
//! that was never accepted is `never_connected`; a disabled zone is
//! `disabled`, whatever its stream does. Exactly at the timeout a zone is
//! still online.
//!
//! [`state`] is a pure function of [`LivenessInputs`]; the inputs' own
//! [`LivenessInputs::opened`] and [`LivenessInputs::heartbeat`] keep
//! `online_since` (when the zone last came online), so `since` stays
//! right across a reconnect within the timeout. Its result, [`Liveness`]
//! and [`ZoneState`], is read-model data ([`crate::view::zones`]).

use std::time::Duration;

use super::{elapsed, plus};
use crate::clock::Timestamp;
use crate::view::zones::{Liveness, ZoneState};

/// What the global recorded of a zone, every time on its own clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LivenessInputs {
    /// When the last message of an accepted stream arrived.
    pub last_heartbeat: Option<Timestamp>,
    /// When the current (or last) stream was accepted.
    pub stream_opened: Option<Timestamp>,
    /// When the zone last came online; kept by [`LivenessInputs::opened`]
    /// and [`LivenessInputs::heartbeat`]. `None` (inputs restored without
    /// it): `stream_opened` stands in.
    pub online_since: Option<Timestamp>,
    /// When an operator disabled the zone; `None` while it is enabled.
    pub disabled: Option<Timestamp>,
}

impl LivenessInputs {
    /// `max(last heartbeat, stream opened)`: the last sign of life.
    pub fn last_seen(&self) -> Option<Timestamp> {
        self.last_heartbeat.max(self.stream_opened)
    }

    /// Records a stream of the zone accepted at `at`.
    pub fn opened(&mut self, at: Timestamp, timeout: Duration) {
        self.online_since = Some(self.online_since_after(at, timeout));
        self.stream_opened = Some(at);
    }

    /// Records a message of an accepted stream arrived at `at`.
    pub fn heartbeat(&mut self, at: Timestamp, timeout: Duration) {
        self.online_since = Some(self.online_since_after(at, timeout));
        self.last_heartbeat = Some(at);
    }

    /// When the zone's online run began, given a sign of life at `at`: the
    /// run it continues, or `at` when the zone was not online just before.
    fn online_since_after(&self, at: Timestamp, timeout: Duration) -> Timestamp {
        match connection(self, at, timeout) {
            Liveness {
                state: ZoneState::Online,
                since: Some(since),
                ..
            } => since,
            _ => at,
        }
    }
}

/// The zone's state at `now` (the global's clock), by the rule in the
/// module comment.
pub fn state(inputs: &LivenessInputs, now: Timestamp, timeout: Duration) -> Liveness {
    if let Some(at) = inputs.disabled {
        return Liveness {
            state: ZoneState::Disabled,
            since: Some(at),
            last_seen: inputs.last_seen(),
            offline_at: None,
        };
    }
    connection(inputs, now, timeout)
}

/// [`state`] without the disabled flag.
fn connection(inputs: &LivenessInputs, now: Timestamp, timeout: Duration) -> Liveness {
    let Some(last_seen) = inputs.last_seen() else {
        return Liveness {
            state: ZoneState::NeverConnected,
            since: None,
            last_seen: None,
            offline_at: None,
        };
    };
    let timed_out_at = plus(last_seen, timeout);
    // `None`: the global's clock stepped back behind the last sign of life;
    // that is no reason to call the zone offline.
    if elapsed(last_seen, now).is_some_and(|quiet| quiet > timeout) {
        return Liveness {
            state: ZoneState::Offline,
            since: Some(timed_out_at),
            last_seen: Some(last_seen),
            offline_at: None,
        };
    }
    let since = inputs
        .online_since
        .or(inputs.stream_opened)
        .unwrap_or(last_seen)
        .min(now);
    Liveness {
        state: ZoneState::Online,
        since: Some(since),
        last_seen: Some(last_seen),
        offline_at: Some(plus(timed_out_at, Duration::from_nanos(1))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(30);

    fn t0() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    fn at(secs: u64) -> Timestamp {
        plus(t0(), Duration::from_secs(secs))
    }

    fn opened_at(secs: u64) -> LivenessInputs {
        let mut inputs = LivenessInputs::default();
        inputs.opened(at(secs), TIMEOUT);
        inputs
    }

    #[test]
    fn a_zone_never_accepted_is_never_connected() {
        let l = state(&LivenessInputs::default(), at(1000), TIMEOUT);
        assert_eq!(l.state, ZoneState::NeverConnected);
        assert_eq!((l.since, l.last_seen, l.offline_at), (None, None, None));
    }

    #[test]
    fn an_accepted_stream_is_online_from_when_it_opened() {
        let l = state(&opened_at(0), at(5), TIMEOUT);
        assert_eq!(l.state, ZoneState::Online);
        assert_eq!(l.since, Some(at(0)));
        assert_eq!(l.last_seen, Some(at(0)));
        assert_eq!(l.offline_at, Some(plus(at(30), Duration::from_nanos(1))));
    }

    #[test]
    fn exactly_at_the_timeout_it_is_online_a_nanosecond_later_offline() {
        let inputs = opened_at(0);
        assert_eq!(state(&inputs, at(30), TIMEOUT).state, ZoneState::Online);
        let later = plus(at(30), Duration::from_nanos(1));
        let l = state(&inputs, later, TIMEOUT);
        assert_eq!(l.state, ZoneState::Offline);
        // Offline since the timeout ran out, not since someone looked.
        assert_eq!(l.since, Some(at(30)));
        assert_eq!(l.last_seen, Some(at(0)));
        assert_eq!(l.offline_at, None);
        // The moment the online state announced is the first offline one.
        let online = state(&inputs, at(1), TIMEOUT);
        assert_eq!(
            state(&inputs, online.offline_at.unwrap(), TIMEOUT).state,
            ZoneState::Offline
        );
    }

    #[test]
    fn heartbeats_keep_it_online_and_the_later_of_both_times_counts() {
        let mut inputs = opened_at(0);
        inputs.heartbeat(at(20), TIMEOUT);
        let l = state(&inputs, at(45), TIMEOUT);
        assert_eq!(l.state, ZoneState::Online);
        assert_eq!(
            l.since,
            Some(at(0)),
            "one online run since the stream opened"
        );
        assert_eq!(l.last_seen, Some(at(20)));
        let l = state(&inputs, at(51), TIMEOUT);
        assert_eq!((l.state, l.since), (ZoneState::Offline, Some(at(50))));

        // A newer stream without a heartbeat yet: its opening is the last sign of life.
        let mut inputs = LivenessInputs::default();
        inputs.heartbeat(at(10), TIMEOUT);
        inputs.opened(at(35), TIMEOUT);
        assert_eq!(state(&inputs, at(60), TIMEOUT).last_seen, Some(at(35)));
        assert_eq!(state(&inputs, at(60), TIMEOUT).state, ZoneState::Online);
    }

    #[test]
    fn a_reconnect_within_the_timeout_keeps_since_one_after_it_starts_anew() {
        let mut inputs = opened_at(0);
        inputs.heartbeat(at(10), TIMEOUT);
        // The stream broke; a new one is accepted 25 s after the last message.
        inputs.opened(at(35), TIMEOUT);
        assert_eq!(state(&inputs, at(40), TIMEOUT).since, Some(at(0)));
        // Silent from 35 s to 100 s: offline at 65 s, online again at 100 s.
        assert_eq!(state(&inputs, at(90), TIMEOUT).since, Some(at(65)));
        inputs.opened(at(100), TIMEOUT);
        let l = state(&inputs, at(101), TIMEOUT);
        assert_eq!((l.state, l.since), (ZoneState::Online, Some(at(100))));
    }

    #[test]
    fn disabled_overrides_everything() {
        let mut inputs = opened_at(0);
        inputs.heartbeat(at(9), TIMEOUT);
        inputs.disabled = Some(at(5));
        let l = state(&inputs, at(10), TIMEOUT);
        assert_eq!(l.state, ZoneState::Disabled);
        assert_eq!(l.since, Some(at(5)));
        assert_eq!(
            l.last_seen,
            Some(at(9)),
            "the last sign of life is still shown"
        );
        assert_eq!(l.offline_at, None);
        assert_eq!(state(&inputs, at(1000), TIMEOUT).state, ZoneState::Disabled);
        let never = LivenessInputs {
            disabled: Some(at(1)),
            ..Default::default()
        };
        assert_eq!(state(&never, at(2), TIMEOUT).state, ZoneState::Disabled);
        // Heartbeats recorded while disabled do not restart the online run.
        let mut inputs = opened_at(0);
        inputs.disabled = Some(at(1));
        inputs.heartbeat(at(10), TIMEOUT);
        inputs.disabled = None;
        assert_eq!(state(&inputs, at(11), TIMEOUT).since, Some(at(0)));
    }

    /// Only the global's clock counts: a sign of life it recorded "in the
    /// future" (its clock stepped back since) is online, never offline, and
    /// `since` is never after `now`.
    #[test]
    fn a_clock_stepping_back_never_makes_a_zone_offline() {
        let inputs = opened_at(3600);
        let l = state(&inputs, at(0), TIMEOUT);
        assert_eq!(l.state, ZoneState::Online);
        assert_eq!(l.since, Some(at(0)));
        assert_eq!(l.last_seen, Some(at(3600)));
    }

    #[test]
    fn inputs_restored_without_online_since_fall_back_to_the_stream() {
        let inputs = LivenessInputs {
            last_heartbeat: Some(at(20)),
            stream_opened: Some(at(3)),
            ..Default::default()
        };
        assert_eq!(state(&inputs, at(21), TIMEOUT).since, Some(at(3)));
        let only_heartbeat = LivenessInputs {
            last_heartbeat: Some(at(20)),
            ..Default::default()
        };
        assert_eq!(state(&only_heartbeat, at(21), TIMEOUT).since, Some(at(20)));
    }

    #[test]
    fn states_have_the_apis_words() {
        let words: Vec<&str> = ZoneState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(words, ["never_connected", "online", "offline", "disabled"]);
        for s in ZoneState::ALL {
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{s}\""));
        }
    }
}
