//! The log's byte budget (`log.max_bytes_per_second`): whatever writes the
//! lines (a flood of refusals, a client's long strings, a flapping fleet),
//! the log grows by at most this many bytes per second. Each line is
//! checked whole as the formatter hands it over; past the budget it is
//! left out and counted, and the first line written once there is room
//! again is preceded by one saying how many lines and bytes were left out.
//!
//! Per-peer line limits ([`crate::net::LogLimiter`]) and the journal's
//! budget ([`crate::journal`]) keep one source from crowding out the
//! others; this is the bound on the sum.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::clock::{Clock as _, SystemClock};

/// The budget's window.
pub const WINDOW: Duration = Duration::from_secs(1);

/// Bytes per [`WINDOW`]; pure over the time it is given.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    bytes: u64,
    start: Option<Instant>,
    used: u64,
    left_out_lines: u64,
    left_out_bytes: u64,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write it; first say that `lines` lines of `bytes` bytes were left
    /// out, when `lines` > 0.
    Write { lines: u64, bytes: u64 },
    /// Leave it out (counted).
    LeaveOut,
}

impl ByteBudget {
    /// `bytes` per window; 0 means no limit.
    pub fn new(bytes: u64) -> ByteBudget {
        ByteBudget {
            bytes,
            start: None,
            used: 0,
            left_out_lines: 0,
            left_out_bytes: 0,
        }
    }

    /// Whether a line of `len` bytes may be written at `now`.
    pub fn admit(&mut self, len: u64, now: Instant) -> Verdict {
        if self.bytes == 0 {
            return Verdict::Write { lines: 0, bytes: 0 };
        }
        if self
            .start
            .is_none_or(|start| now.duration_since(start) >= WINDOW)
        {
            self.start = Some(now);
            self.used = 0;
        }
        // A line longer than the whole budget is still written when it
        // comes first in its window, so that no line is lost for its size alone.
        if self.used > 0 && self.used + len > self.bytes {
            self.left_out_lines += 1;
            self.left_out_bytes += len;
            return Verdict::LeaveOut;
        }
        self.used += len;
        Verdict::Write {
            lines: std::mem::take(&mut self.left_out_lines),
            bytes: std::mem::take(&mut self.left_out_bytes),
        }
    }
}

/// The line that says what was left out, in the log's format.
pub fn left_out_line(json: bool, lines: u64, bytes: u64, at: SystemTime) -> String {
    let message =
        format!("log.max_bytes_per_second reached: {lines} lines ({bytes} bytes) were left out");
    let timestamp = humantime::format_rfc3339_micros(at);
    match json {
        true => format!(
            "{}\n",
            serde_json::json!({
                "timestamp": timestamp.to_string(),
                "level": "WARN",
                "fields": { "message": message, "left_out_lines": lines, "left_out_bytes": bytes },
                "target": "hdsd::log",
            })
        ),
        false => format!("{timestamp}  WARN hdsd::log: {message}\n"),
    }
}

/// Standard error under a [`ByteBudget`], as a writer for the formatter.
#[derive(Debug, Clone)]
pub struct BudgetedStderr {
    budget: Arc<Mutex<ByteBudget>>,
    json: bool,
}

impl BudgetedStderr {
    pub fn new(bytes_per_second: u64, json: bool) -> BudgetedStderr {
        BudgetedStderr {
            budget: Arc::new(Mutex::new(ByteBudget::new(bytes_per_second))),
            json,
        }
    }
}

impl Write for BudgetedStderr {
    /// The formatter writes each line whole in one call.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let verdict = self
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(buf.len() as u64, Instant::now());
        if let Verdict::Write { lines, bytes } = verdict {
            let mut err = io::stderr().lock();
            if lines > 0 {
                err.write_all(
                    left_out_line(self.json, lines, bytes, SystemTime::from(SystemClock.now()))
                        .as_bytes(),
                )?;
            }
            err.write_all(buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BudgetedStderr {
    type Writer = BudgetedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bytes_lines_are_left_out_and_the_next_one_says_so() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(1000);
        assert_eq!(b.admit(600, t0), Verdict::Write { lines: 0, bytes: 0 });
        assert_eq!(b.admit(300, t0), Verdict::Write { lines: 0, bytes: 0 });
        // 112 MB of log in 9.5 s was the finding: here, 200 bytes too many.
        assert_eq!(b.admit(200, t0), Verdict::LeaveOut);
        assert_eq!(
            b.admit(150, t0 + Duration::from_millis(900)),
            Verdict::LeaveOut
        );
        // A line that fits again says what was left out before it.
        assert_eq!(
            b.admit(100, t0 + Duration::from_millis(950)),
            Verdict::Write {
                lines: 2,
                bytes: 350
            }
        );
        assert_eq!(
            b.admit(1, t0 + Duration::from_millis(990)),
            Verdict::LeaveOut
        );
        assert_eq!(
            b.admit(900, t0 + WINDOW),
            Verdict::Write { lines: 1, bytes: 1 }
        );
    }

    #[test]
    fn a_line_larger_than_the_budget_is_written_first_in_its_window() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(100);
        assert_eq!(b.admit(500, t0), Verdict::Write { lines: 0, bytes: 0 });
        assert_eq!(b.admit(1, t0), Verdict::LeaveOut);
        let mut unlimited = ByteBudget::new(0);
        for _ in 0..1000 {
            assert_eq!(
                unlimited.admit(1 << 20, t0),
                Verdict::Write { lines: 0, bytes: 0 }
            );
        }
    }

    #[test]
    fn the_left_out_line_is_in_the_log_format() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let text = left_out_line(false, 3, 4096, at);
        assert!(text.ends_with(
            "WARN hdsd::log: log.max_bytes_per_second reached: 3 lines (4096 bytes) were left out\n"
        ));
        let json: serde_json::Value =
            serde_json::from_str(&left_out_line(true, 3, 4096, at)).expect("one JSON line");
        assert_eq!(json["level"], "WARN");
        assert_eq!(json["fields"]["left_out_lines"], 3);
    }
}
