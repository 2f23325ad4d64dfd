//! A zone's reconnect delays: exponential backoff with full jitter.
//!
//! The n-th delay after a failure is a uniformly random point of
//! `[0, min(cap, start * 2^n))` ("full jitter": zones that lost the global
//! together do not come back together). A connection that stayed up for
//! `reset_after` resets the sequence; a shorter one does not, so a global
//! that accepts and then drops every stream is not hammered. Defaults:
//! start 1 s, cap 30 s, reset after 60 s. Pure: the random fraction (or a
//! [`rand::Rng`]) and the time are passed in.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::zones::{elapsed, human};

/// Why a backoff's settings cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackoffError {
    /// A zero start would never wait.
    #[error("the reconnect backoff's first delay is 0: set it above 0 (e.g. 1s)")]
    ZeroStart,
    /// The start is above the cap.
    #[error("the reconnect backoff's first delay ({start}) is longer than its longest ({cap}): make the first delay at most the longest")]
    StartAboveCap {
        /// The first delay, as people read it.
        start: String,
        /// The longest delay, as people read it.
        cap: String,
    },
    /// A zero reset period would reset on every connection.
    #[error("the reconnect backoff's reset period is 0: set it above 0 (e.g. 60s), the time a connection must stay up to count as stable")]
    ZeroReset,
}

/// Exponential backoff with full jitter, reset after a stable connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    start: Duration,
    cap: Duration,
    reset_after: Duration,
    /// Failures since the last reset.
    attempt: u32,
    /// When the current connection was established, while it is up.
    connected_at: Option<Timestamp>,
}

impl Default for Backoff {
    /// Start 1 s, cap 30 s, reset after a stable minute.
    fn default() -> Self {
        Backoff {
            start: Backoff::START,
            cap: Backoff::CAP,
            reset_after: Backoff::RESET_AFTER,
            attempt: 0,
            connected_at: None,
        }
    }
}

impl Backoff {
    /// The default first delay's ceiling.
    pub const START: Duration = Duration::from_secs(1);
    /// The default longest delay.
    pub const CAP: Duration = Duration::from_secs(30);
    /// How long a connection must stay up, by default, to reset the delays.
    pub const RESET_AFTER: Duration = Duration::from_secs(60);

    /// A backoff from `start` doubling up to `cap`, reset by a connection
    /// that stays up for `reset_after`.
    pub fn new(
        start: Duration,
        cap: Duration,
        reset_after: Duration,
    ) -> Result<Backoff, BackoffError> {
        if start.is_zero() {
            return Err(BackoffError::ZeroStart);
        }
        if start > cap {
            return Err(BackoffError::StartAboveCap {
                start: human(start).to_string(),
                cap: human(cap).to_string(),
            });
        }
        if reset_after.is_zero() {
            return Err(BackoffError::ZeroReset);
        }
        Ok(Backoff {
            start,
            cap,
            reset_after,
            attempt: 0,
            connected_at: None,
        })
    }

    /// The ceiling of the next delay: `min(cap, start * 2^attempts)`.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt).unwrap_or(u32::MAX);
        self.start.saturating_mul(factor).min(self.cap)
    }

    /// The longest delay: what a zone waits after a permanent refusal (no
    /// jitter down to zero: an operator has to change something first).
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// Failures since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The next delay: `fraction` (in `[0, 1)`; clamped, and 0 when not a
    /// number) of the current ceiling. Then the ceiling doubles, up to the cap.
    pub fn next_delay(&mut self, fraction: f64) -> Duration {
        let fraction = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        let ceiling = self.ceiling();
        // Never above the ceiling, even where f64 rounds up near `Duration::MAX`.
        let delay = Duration::try_from_secs_f64(ceiling.as_secs_f64() * fraction)
            .unwrap_or(ceiling)
            .min(ceiling);
        if ceiling < self.cap {
            self.attempt = self.attempt.saturating_add(1);
        }
        delay
    }

    /// [`Backoff::next_delay`] with a fraction drawn from `rng`.
    pub fn next_delay_with<R: rand::Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        let fraction: f64 = rng.gen();
        self.next_delay(fraction)
    }

    /// The stream was established (accepted by the global) at `now`.
    pub fn connected(&mut self, now: Timestamp) {
        self.connected_at = Some(now);
    }

    /// The stream ended at `now`: the delays start over when it stayed up
    /// for at least `reset_after` (never when the clock stepped back).
    pub fn disconnected(&mut self, now: Timestamp) {
        if let Some(at) = self.connected_at.take() {
            if elapsed(at, now).is_some_and(|up| up >= self.reset_after) {
                self.attempt = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::zones::plus;

    fn t0() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn ceilings_double_from_one_second_to_thirty() {
        let mut b = Backoff::default();
        let ceilings: Vec<u64> = (0..8)
            .map(|_| {
                let c = b.ceiling().as_secs();
                b.next_delay(0.5);
                c
            })
            .collect();
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn full_jitter_picks_anywhere_below_the_ceiling() {
        let mut b = Backoff::default();
        assert_eq!(b.next_delay(0.0), Duration::ZERO);
        assert_eq!(b.next_delay(0.5), Duration::from_secs(1));
        assert_eq!(b.next_delay(0.25), Duration::from_secs(1));
        // Out of range and NaN fractions stay within [0, ceiling].
        let mut b = Backoff::default();
        assert_eq!(b.next_delay(7.0), Duration::from_secs(1));
        assert_eq!(b.next_delay(-1.0), Duration::ZERO);
        assert_eq!(b.next_delay(f64::NAN), Duration::ZERO);
    }

    #[test]
    fn a_random_source_stays_below_each_ceiling() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut b = Backoff::default();
        for _ in 0..100 {
            let ceiling = b.ceiling();
            let d = b.next_delay_with(&mut rng);
            assert!(d <= ceiling, "{d:?} > {ceiling:?}");
        }
        assert_eq!(b.ceiling(), Backoff::CAP);
    }

    #[test]
    fn a_stable_minute_resets_a_shorter_connection_does_not() {
        let mut b = Backoff::default();
        for _ in 0..5 {
            b.next_delay(0.5);
        }
        assert_eq!(b.ceiling(), Duration::from_secs(30));
        // Up for 59 s: still backing off.
        b.connected(t0());
        b.disconnected(plus(t0(), Duration::from_secs(59)));
        assert_eq!(b.ceiling(), Duration::from_secs(30));
        // Up for exactly a minute: back to the start.
        b.connected(t0());
        b.disconnected(plus(t0(), Duration::from_secs(60)));
        assert_eq!((b.ceiling(), b.attempts()), (Duration::from_secs(1), 0));
        // A disconnect without a connect, or with the clock stepped back, resets nothing.
        b.next_delay(0.5);
        b.disconnected(plus(t0(), Duration::from_secs(600)));
        b.connected(plus(t0(), Duration::from_secs(600)));
        b.disconnected(t0());
        assert_eq!(b.attempts(), 1);
    }

    #[test]
    fn settings_that_cannot_work_are_refused_with_the_fix() {
        let s = Duration::from_secs;
        assert_eq!(
            Backoff::new(s(0), s(30), s(60)),
            Err(BackoffError::ZeroStart)
        );
        assert_eq!(
            Backoff::new(s(1), s(30), s(0)),
            Err(BackoffError::ZeroReset)
        );
        let e = Backoff::new(s(40), s(30), s(60)).unwrap_err().to_string();
        assert!(
            e.contains("40s") && e.contains("30s") && e.contains("at most"),
            "{e}"
        );
        let b = Backoff::new(Duration::from_millis(200), s(5), s(10)).unwrap();
        assert_eq!((b.ceiling(), b.cap()), (Duration::from_millis(200), s(5)));
    }

    #[test]
    fn many_failures_never_overflow() {
        let mut b = Backoff::new(
            Duration::from_nanos(1),
            Duration::MAX,
            Duration::from_secs(1),
        )
        .unwrap();
        for _ in 0..200 {
            b.next_delay(0.99);
        }
        assert!(b.ceiling() > Duration::from_secs(1));
    }
}
