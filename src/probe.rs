//! Probe settings (how one inbound is checked) and their validation rules.
//!
//! Envoy never NACKs a `HealthCheckSpecifier`: a zero or missing duration can
//! crash it or make it drop the check silently. Every rule below is checked
//! before anything is sent, each with its own message.

use std::fmt;
use std::time::Duration;

/// The effective settings of one TCP probe.
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
            if self.timeout > other {
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
