//! Time as a dependency: the system clock in production, a manual one in tests.

use std::sync::{Arc, Mutex};

use chrono::Utc;

/// A moment in time, as every part of hdsd passes it (UTC).
pub type Timestamp = chrono::DateTime<Utc>;

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(
        clippy::disallowed_methods,
        reason = "the one read of the wall clock (.clippy.toml)"
    )]
    fn now(&self) -> Timestamp {
        Utc::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(Mutex::new(start)))
    }

    pub fn advance(&self, by: std::time::Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
