//! The fleet's journal: one info line per event an operator follows (an
//! Envoy connected or disconnected, an inbound turned ready or not ready),
//! under one budget for the whole process, so a flapping fleet cannot
//! flood the log: at most [`LINES`] lines per [`WINDOW`]; past it, lines
//! are counted, and the next line logged says how many were left out.
//! Every field is hdsd's own or validated (dataplane names, ports, status
//! words), so no line is longer than a few hundred bytes.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Lines per window, for the whole process.
pub const LINES: u32 = 100;

/// The budget's window.
pub const WINDOW: Duration = Duration::from_secs(10);

/// A budget of lines per window: what is left of it, and what it left out.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    lines: u32,
    window: Duration,
    start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl Budget {
    /// `lines` per `window`.
    pub const fn new(lines: u32, window: Duration) -> Budget {
        Budget {
            lines,
            window,
            start: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// Whether a line may be logged at `now`: `Some(n)` with `n` lines left
    /// out since the last one logged, or `None` (counted as left out).
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .start
            .is_none_or(|start| now.duration_since(start) >= self.window)
        {
            self.start = Some(now);
            self.used = 0;
        }
        if self.used < self.lines {
            self.used += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

static BUDGET: Mutex<Budget> = Mutex::new(Budget::new(LINES, WINDOW));

fn allow() -> Option<u64> {
    BUDGET
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .allow(Instant::now())
}

/// An inbound's status changed (`from` and `to` are status words).
pub fn transition(dataplane: &dyn Display, port: u16, from: &str, to: &str, ready: bool) {
    let Some(suppressed) = allow() else { return };
    let what = if ready {
        "inbound ready"
    } else {
        "inbound not ready"
    };
    tracing::info!(
        target: "hdsd::journal",
        dataplane = %dataplane,
        port,
        from,
        to,
        suppressed,
        "{what}"
    );
}

/// A dataplane's Envoy opened its HDS stream on this instance.
pub fn connected(dataplane: &dyn Display, peer: Option<SocketAddr>, version: Option<&dyn Display>) {
    let Some(suppressed) = allow() else { return };
    tracing::info!(
        target: "hdsd::journal",
        dataplane = %dataplane,
        peer = peer.map(|p| p.to_string()),
        envoy_version = version.map(|v| v.to_string()),
        suppressed,
        "Envoy connected"
    );
}

/// A dataplane's Envoy's HDS stream on this instance ended.
pub fn disconnected(dataplane: &dyn Display, peer: Option<SocketAddr>) {
    let Some(suppressed) = allow() else { return };
    tracing::info!(
        target: "hdsd::journal",
        dataplane = %dataplane,
        peer = peer.map(|p| p.to_string()),
        suppressed,
        "Envoy disconnected"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_budget_leaves_lines_out_and_says_how_many_when_it_refills() {
        let mut b = Budget::new(3, Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(b.allow(start), Some(0));
        assert_eq!(b.allow(start), Some(0));
        assert_eq!(b.allow(start), Some(0));
        for _ in 0..5 {
            assert_eq!(b.allow(start + Duration::from_secs(9)), None);
        }
        let later = start + Duration::from_secs(10);
        assert_eq!(b.allow(later), Some(5), "the five left out, told once");
        assert_eq!(b.allow(later), Some(0));
    }
}
